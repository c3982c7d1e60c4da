"""The documentation as a user reads it: README.md and every page under docs/.

- every python block runs as written (blocks preceded by ``<!-- docs-test: slow -->`` in the slow tier, `pytest -m slow`; by
  ``<!-- docs-test: skip -->`` never, e.g. where they need a GPU or the vla extra);
- every ``rlrobot ...`` line of a ``bash`` block parses with today's flags, and train lines also validate (without
  running); lines that need hardware or files a fresh clone lacks (a GPU, a run to resume) are only parsed. A dated
  experiments page is history: once a flag it used changes, turn its block into a ``text`` block and say at which
  commit it ran;
- every registered algorithm and every native task has its page, in the shape the pages promise;
- the links to examples/ and to the dated experiments resolve.

The generated results blocks are checked against results/*.json by tests/results/test_readme_results.py.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import tyro

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
FENCE = re.compile(r"(?:<!-- docs-test: (?P<mark>slow|skip)[^>]*-->\n)?```(?P<lang>[a-z]*)\n(?P<body>.*?)```", re.S)


def doc_files() -> list[Path]:
    return [README, *sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.parts)]


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def blocks(path: Path, language: str) -> list[tuple[str, str | None]]:
    """(body, mark) of every fenced block of ``language``; mark is 'slow', 'skip' or None."""
    return [(m.group("body"), m.group("mark")) for m in FENCE.finditer(path.read_text()) if m.group("lang") == language]


def command_lines(path: Path) -> list[list[str]]:
    lines = []
    for block, _ in blocks(path, "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            for part in re.split(r"&&|;", line.split("  #")[0].split(" # ")[0]):
                if "rlrobot " not in part:
                    continue
                words = shlex.split(part.strip(), comments=True)
                if "rlrobot" in words and words[0] in ("rlrobot", "torchrun"):
                    words = words[words.index("rlrobot"):]
                    if len(words) > 1:
                        lines.append([_expand(w) for w in words[1:]])
    return lines


def _expand(word: str) -> str:
    return (word.replace("$TOKEN", "0123456789abcdef0123456789abcdef").replace("$fam", "pick-place")
            .replace("[", "").replace("]", ""))


def _python_cases():
    for path in doc_files():
        for i, (body, mark) in enumerate(blocks(path, "python")):
            if mark == "skip":
                continue
            marks = [pytest.mark.slow] if mark == "slow" else []
            yield pytest.param(body, id=f"{_rel(path)}[{i}]", marks=marks)


def _command_cases():
    for path in doc_files():
        for argv in command_lines(path):
            yield pytest.param(argv, id=f"{_rel(path)}: {' '.join(argv)[:80]}")


@pytest.mark.parametrize("snippet", list(_python_cases()))
def test_python_blocks_run_as_written(snippet, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MUJOCO_GL": "egl"}
    p = subprocess.run([sys.executable, "-c", snippet], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, f"snippet failed:\n{snippet}\n--- stdout\n{p.stdout}\n--- stderr\n{p.stderr}"


def test_there_are_commands_and_snippets_to_check():
    assert sum(len(command_lines(p)) for p in doc_files()) >= 100
    assert len(list(_python_cases())) >= 5
    assert command_lines(README) and blocks(README, "python")


@pytest.mark.parametrize("argv", list(_command_cases()))
def test_command_lines_parse(argv):
    from rlrobot.commands import COMMANDS
    from rlrobot.commands.train import parse_train_args

    command, rest = argv[0], argv[1:]
    assert command in COMMANDS or command in ("--help", "-h", "--version"), command
    if command == "train":
        if "--help" in rest:
            return
        if "--setup" in rest and not Path(rest[rest.index("--setup") + 1]).is_file():
            from rlrobot.tasks.setup import DEFAULT_SETUP

            # the user's own station file (written by `rlrobot camera align`): the shipped default stands in for it
            rest = [*rest[:rest.index("--setup") + 1], str(DEFAULT_SETUP), *rest[rest.index("--setup") + 2:]]
        cfg = parse_train_args(rest)
        if cfg.resume or "cuda" in cfg.device or cfg.backend in ("mjwarp", "isaaclab") or cfg.task.startswith(
                ("maniskill:", "isaaclab:")):
            return  # needs a run to resume, a GPU or a simulator that is an optional extra: parsed only
        cfg.validate()
    elif command in ("eval", "collect", "bench", "serve", "deploy"):
        if "--help" in rest:
            return
        from rlrobot.commands.bench import BenchArgs
        from rlrobot.commands.collect import CollectArgs
        from rlrobot.commands.eval import EvalArgs
        from rlrobot.real_robot.deploy import DeployArgs
        from rlrobot.real_robot.server import ServeArgs

        kind = {"eval": EvalArgs, "collect": CollectArgs, "bench": BenchArgs, "serve": ServeArgs, "deploy": DeployArgs}
        tyro.cli(kind[command], args=rest)


# ---------------------------------------------------------------------- the pages every algorithm and task must have
ALGORITHM_SECTIONS = ("## Objective", "## Usage", "## Preset", "## Logged metrics", "## Implementation details", "## Results")


def algorithm_page(algo: str) -> Path:
    from rlrobot.results.report import algorithm_page as page

    return DOCS / page(algo)


def test_every_registered_algorithm_has_a_page_in_one_shape():
    from rlrobot.algorithms.registry import algorithm_names

    for algo in algorithm_names():
        page = algorithm_page(algo)
        assert page.is_file(), f"algorithm {algo!r} has no page ({_rel(page)}): add one (docs/algorithms/ppo.md is the model)"
        text = page.read_text()
        for section in ALGORITHM_SECTIONS:
            assert f"\n{section}" in text, f"{_rel(page)} lacks its {section!r} section"
        assert f"<!-- generated: algo {algo} -->" in text, f"{_rel(page)} lacks the generated results block of {algo}"
        assert f"<!-- docs: presets {algo} -->" in text, f"{_rel(page)} lacks the generated preset table of {algo}"
        assert f"<!-- docs: algo-header {algo} -->" in text, f"{_rel(page)} lacks the generated header line of {algo}"


def test_every_algorithm_page_is_in_the_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in sorted((DOCS / "algorithms").glob("*.md")):
        assert f"algorithms/{page.name}" in nav, f"{_rel(page)} is not in mkdocs.yml's nav"


def test_every_native_task_is_on_a_task_family_page():
    from rlrobot.tasks.registry import native_task_ids

    shown = set()
    for page in (DOCS / "tasks").glob("*.md"):
        for m in re.finditer(r"<!-- docs: tasks ([^>]+) -->", page.read_text()):
            shown |= set(m.group(1).split())
    missing = [t for t in native_task_ids() if t not in shown and not t.startswith("so101-reach-low")]
    assert not missing, f"tasks without a page's spaces table (<!-- docs: tasks ... --> on a docs/tasks page): {missing}"


def test_experiments_pages_are_dated_and_marked_as_history():
    pages = [p for p in (DOCS / "experiments").glob("*.md") if p.name != "index.md"]
    assert pages
    index = (DOCS / "experiments" / "index.md").read_text()
    for page in pages:
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}-[a-z0-9-]+\.md", page.name), page.name
        text = page.read_text()
        assert '!!! note "History"' in text and "results/index.md" in text, f"{page.name} lacks the history note"
        assert f"({page.name})" in index, f"{page.name} is not listed in docs/experiments/index.md"


MODULE_PATH = re.compile(r"`((?:rlrobot|policies|tasks|real_robot|configs)/[A-Za-z0-9_./]*)`")
DOTTED = re.compile(r"`(rlrobot(?:\.[A-Za-z_][A-Za-z0-9_]*)+)`")


def test_source_paths_and_modules_named_in_the_docs_exist():
    """A module that moves leaves no stale name behind: every source path (`rlrobot/...`, `policies/...`) and every
    dotted name (`rlrobot.x.y`, a module or an attribute of one) on a current page resolves. The dated experiments
    pages are history and keep the names of their day."""
    import importlib

    stale = []
    for path in doc_files():
        if "experiments" in path.parts:
            continue
        text = path.read_text()
        for name in MODULE_PATH.findall(text):
            if not (ROOT / name).exists():
                stale.append(f"{_rel(path)}: {name}")
        for name in DOTTED.findall(text):
            parts = name.split(".")
            for cut in range(len(parts), 0, -1):
                try:
                    obj = importlib.import_module(".".join(parts[:cut]))
                except ImportError:
                    continue
                try:
                    for attr in parts[cut:]:
                        obj = getattr(obj, attr)
                except AttributeError:
                    stale.append(f"{_rel(path)}: {name}")
                break
            else:
                stale.append(f"{_rel(path)}: {name}")
    assert not stale, f"names on the pages that no longer exist: {stale}"


def test_links_to_examples_resolve():
    for path in doc_files():
        for target in re.findall(r"\]\(((?:\.\./)*examples/[^)#]+)\)", path.read_text()):
            name = target.split("examples/", 1)[1]
            assert (ROOT / "examples" / name).is_file(), f"{_rel(path)} links {target}: no examples/{name}"
