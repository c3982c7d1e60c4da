"""Every algorithm page's "Logged metrics" table names keys the algorithm really logs, and every ``loss/*`` key it
logs is named on its page (or on the page its section links to, e.g. WSRL's to SAC's). Slow tier: it trains each
registered algorithm for two tiny iterations, with the smoke settings of the registry's own test."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from rlrobot.algorithms.registry import algorithm_names

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
KEY = re.compile(r"`((?:loss|train|eval|perf|done|trim|jsrl)/[a-z0-9_]+)`")
pytestmark = pytest.mark.slow


def _section(page: Path, anchor: str = "logged-metrics") -> str:
    text = page.read_text()
    title = {"logged-metrics": "## Logged metrics"}[anchor]
    return text.split(f"\n{title}", 1)[1].split("\n## ", 1)[0]


def documented(page: Path) -> tuple[set[str], set[str]]:
    """(keys of the section's table rows, every key named in the section or in the sections it links to)."""
    section = _section(page)
    table = {k for line in section.splitlines() if line.startswith("| `") for k in KEY.findall(line)}
    named = set(KEY.findall(section))
    for target in re.findall(r"\]\(([a-z0-9-]+\.md)#logged-metrics\)", section):
        named |= documented(page.parent / target)[1]
    return table, named


def _smoke_config():
    spec = importlib.util.spec_from_file_location("registry_smoke", ROOT / "tests" / "algorithms" / "test_registry.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._smoke_config


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    from rlrobot.commands.collect import CollectArgs, collect_demonstrations

    out = tmp_path_factory.mktemp("demos") / "reach"
    collect_demonstrations(CollectArgs(task="so101-reach", episodes=2, out=str(out), num_envs=2))
    return out


@pytest.mark.parametrize("algo", [a for a in algorithm_names() if not a.startswith("vla-")])
def test_logged_metrics_tables_match_what_the_algorithm_logs(algo, tmp_path, demos):
    from rlrobot.results.report import algorithm_page
    from rlrobot.runners.base import make_runner

    cfg = _smoke_config()(algo, tmp_path, demos)
    make_runner(cfg).learn()
    logged = set()
    for line in (Path(cfg.out) / "metrics.jsonl").read_text().splitlines():
        logged |= set(json.loads(line))
    page = DOCS / algorithm_page(algo)
    table, named = documented(page)
    assert table or "#logged-metrics)" in _section(page), f"the logged-metrics section of {algo} names no key"
    assert not table - logged, f"{algo}'s page names keys it does not log: {sorted(table - logged)}"
    losses = {k for k in logged if k.startswith("loss/")}
    assert not losses - named, f"{algo} logs keys its page does not name: {sorted(losses - named)}"
