"""Every published figure is generated from results/*.json: the README's headline table and every generated block of
the documentation must equal what `rlrobot results table` writes from the committed files, so a hand-edited figure (or
a results file not regenerated into the pages) fails here."""

import copy
import json
import re
from pathlib import Path

import pytest

from rlrobot.results.registry import ENTRIES
from rlrobot.results.report import (
    BEGIN,
    BLOCK,
    END,
    algorithm_page,
    expected_docs,
    experiment_links,
    load_results,
    readme_block,
    render_page,
    replace_block,
    results_block,
)

ROOT = Path(__file__).parent.parent.parent
README = ROOT / "README.md"
RESULTS = ROOT / "results"
DOCS = ROOT / "docs"


def test_readme_table_is_generated_from_the_results_files():
    expected = results_block(load_results(RESULTS))
    actual = readme_block(README.read_text())
    assert actual == expected, ("README's results table differs from results/*.json: run `rlrobot results table` "
                                "(never edit the table by hand)")


def test_docs_blocks_are_generated_from_the_results_files():
    expected = expected_docs(load_results(RESULTS), DOCS)
    assert len(expected) >= 20  # the algorithm pages, the task pages, results, hardware, the home page
    stale = [str(page.relative_to(ROOT)) for page, text in expected.items() if page.read_text() != text]
    assert not stale, (f"generated blocks differ from results/*.json in {stale}: run `rlrobot results table` "
                       "(never edit a generated block by hand)")


def test_every_entry_is_on_the_results_page_and_on_its_algorithms_pages():
    results_page = (DOCS / "results" / "index.md").read_text()
    have = {r["name"] for r in load_results(RESULTS)}
    for e in ENTRIES:
        assert f"`{e.name}`" in results_page, f"{e.name} is not on docs/results/index.md"
        for algo in e.algos:
            page = DOCS / algorithm_page(algo)
            assert f"<!-- generated: algo {algo} -->" in page.read_text(), f"{page} has no results block for {algo}"
            if e.name in have:
                assert f"`{e.name}`" in page.read_text(), f"{e.name} is missing from {page}"


def test_entries_name_registered_algorithms_and_experiments_name_registered_entries():
    from rlrobot.algorithms.registry import algorithm_names

    known = set(algorithm_names())
    for e in ENTRIES:
        assert set(e.algos) <= known, f"{e.name}: algos {sorted(set(e.algos) - known)} are not registered"
    names = {e.name for e in ENTRIES}
    for entry, pages in experiment_links(DOCS).items():
        assert entry in names, f"{pages} name {entry!r} in their front matter, which is no registry entry"


def test_every_results_file_is_a_registered_entry_with_its_figures():
    names = {e.name: e for e in ENTRIES}
    for result in load_results(RESULTS):
        assert result["name"] in names, f"results/{result['name']}.json is no registry entry"
        entry = names[result["name"]]
        assert [f["key"] for f in result["figures"]] == [f.key for f in entry.figures]
        for fig in result["figures"]:
            s = result["summary"][fig["key"]]
            values = [p["figures"][fig["key"]] for p in result["per_seed"]]
            assert s["values"] == values and s["n"] == len(values) == len(result["seeds"])
            assert s["mean"] == pytest.approx(sum(values) / len(values))
        assert all(r["returncode"] == 0 for p in result["per_seed"] for r in p["steps"])


def _fake_result(value: float, name: str = "ppo-so101-reach") -> dict:
    per_seed = [{"seed": s, "figures": {"train.success": v}, "steps": [{"git_commit": "abcdef0123", "git_dirty": False,
                                                                        "returncode": 0, "wall_s": 60.0}],
                 "curve": {}, "wall_s": 60.0} for s, v in enumerate((value, 0.5))]
    return {"name": name, "title": "PPO", "task": "so101-reach", "group": "headline", "budget": "b",
            "target": "", "notes": "", "figures": [{"key": "train.success", "label": "eval success", "fmt": ".2f",
                                                     "per_seed": True}],
            "summary": {"train.success": {"mean": (value + 0.5) / 2, "std": abs(value - 0.5) / 2 ** 0.5, "n": 2,
                                          "values": [value, 0.5]}},
            "seeds": [0, 1], "commands": ["rlrobot train --seed $S"], "reproduce": "", "written": "2026-12-03 14:00 UTC",
            "code": {"commits": ["abcdef0123"], "dirty": False},
            "wall_s_per_seed": {"mean": 60.0, "std": 0.0, "n": 2, "values": [60.0, 60.0]},
            "machine": {"cpu": "cpu", "cores": 2, "gpu": "none", "torch": "t", "mujoco": "m", "note": ""},
            "per_seed": per_seed}


def test_a_hand_edited_figure_is_caught(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "ppo-so101-reach.json").write_text(json.dumps(_fake_result(0.9)))
    readme = f"# x\n\n## Results\n\n{BEGIN}\nold table\n{END}\n\nafter\n"
    text = replace_block(readme, results_block(load_results(tmp_path / "results")))
    assert text.endswith(f"{END}\n\nafter\n") and "old table" not in text
    block = readme_block(text)
    assert block == results_block(load_results(tmp_path / "results"))  # the generated table passes
    assert "eval success **0.70** ± 0.28 (0.90, 0.50)" in block
    assert "`rlrobot results run --only sac-so101-reach`" in block  # a registered headline entry not run: listed
    edited = text.replace("**0.70**", "**0.75**")
    assert readme_block(edited) != results_block(load_results(tmp_path / "results"))
    # a re-run that changes a figure changes the table
    other = copy.deepcopy(_fake_result(1.0))
    (tmp_path / "results" / "ppo-so101-reach.json").write_text(json.dumps(other))
    assert results_block(load_results(tmp_path / "results")) != block


def test_a_hand_edited_docs_block_is_caught(tmp_path):
    results = [_fake_result(0.9)]
    page = ("# PPO\n\nprose stays\n\n<!-- generated: algo ppo -->\nHAND-EDITED\n<!-- generated: end -->\n\n"
            "<!-- generated: all -->\n<!-- generated: end -->\ntail\n")
    text = render_page(page, results, "algorithms/ppo.md")
    assert text.startswith("# PPO\n\nprose stays\n\n") and text.endswith("<!-- generated: end -->\ntail\n")
    assert "HAND-EDITED" not in text and "eval success **0.70** ± 0.28 (0.90, 0.50)" in text
    assert "[`ppo-so101-reach`](../results/index.md#ppo-so101-reach)" in text
    assert "`sac-so101-reach`" in text  # the "all" block lists the registered entries that have no results yet
    assert render_page(text, results, "algorithms/ppo.md") == text  # regenerating is a fixed point
    assert render_page(text.replace("**0.70**", "**0.75**"), results, "algorithms/ppo.md") == text
    with pytest.raises(ValueError, match="unknown generated block kind"):
        render_page("<!-- generated: nonsense -->\n<!-- generated: end -->", results, "x.md")


def test_block_markers_parse_kind_and_argument():
    text = "<!-- generated: entries a,b -->\nx\n<!-- generated: end -->"
    m = BLOCK.search(text)
    assert (m.group("kind"), m.group("arg"), m.group("body")) == ("entries", "a,b", "x\n")


def test_markers_are_required():
    with pytest.raises(ValueError, match="markers"):
        replace_block("# README without markers\n", "table")


def test_curves_png_per_task_and_per_entry(tmp_path):
    from rlrobot.results.report import curve_file, plot_curves, plot_entry_curves

    result = _fake_result(0.9)
    for i, p in enumerate(result["per_seed"]):
        p["curve"] = {"x": [100.0, 200.0], "y": [0.1 * i, 0.5 + 0.1 * i]}
    written = plot_curves([result], tmp_path)
    assert written == [tmp_path / curve_file("so101-reach")] and written[0].stat().st_size > 5_000
    per_entry = plot_entry_curves([result], tmp_path / "entries")
    assert per_entry == [tmp_path / "entries" / "ppo-so101-reach.png"] and per_entry[0].stat().st_size > 5_000
    before = per_entry[0].stat().st_mtime_ns
    plot_entry_curves([result], tmp_path / "entries")  # unchanged figures: the file is not rewritten
    assert per_entry[0].stat().st_mtime_ns == before
    page = render_page("<!-- generated: all -->\n<!-- generated: end -->\n", [result], "results/index.md")
    assert "](../generated/curves/ppo-so101-reach.png)" in page


def test_hand_written_pages_state_no_registry_figure():
    """Outside the generated blocks (and the dated experiments pages, which are history), no page repeats a figure of
    the results files: each is looked for as the tables print it, where it cannot be a setting by chance (three
    decimals or a thousands separator: '0.932', '3,999'; not '0.99' or '1024', which are also gammas and sizes)."""
    figures = set()
    for r in load_results(RESULTS):
        for fig in r["figures"]:
            s = r["summary"][fig["key"]]
            for value in (s["mean"], *s["values"]):
                text = format(value, fig["fmt"])
                if re.search(r"\d\.\d{3}|\d,\d{3}", text) and text not in ("1.000", "0.000"):
                    figures.add(text)
    pages = [README, *[p for p in DOCS.rglob("*.md") if "experiments" not in p.parts and "hooks" not in p.parts]]
    found = []
    for page in pages:
        prose = BLOCK.sub("", page.read_text())
        prose = prose.split(BEGIN)[0] + prose.split(END)[-1] if BEGIN in prose else prose
        for figure in figures:
            if re.search(rf"(?<![\w.,]){re.escape(figure)}(?![\w,]|\.\d)", prose):
                found.append(f"{page.relative_to(ROOT)}: {figure}")
    assert not found, f"hand-written figures of results/*.json (put them in a generated block): {found}"
