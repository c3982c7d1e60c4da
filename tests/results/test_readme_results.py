"""The README's results table is generated from results/*.json: it must equal what `rlrobot results table` writes
from the committed files, so a hand-edited figure (or a results file not regenerated into the README) fails here."""

import copy
import json
from pathlib import Path

import pytest

from rlrobot.results.registry import ENTRIES
from rlrobot.results.report import BEGIN, END, load_results, readme_block, replace_block, results_block

ROOT = Path(__file__).parent.parent.parent
README = ROOT / "README.md"
RESULTS = ROOT / "results"


def test_readme_table_is_generated_from_the_results_files():
    expected = results_block(load_results(RESULTS))
    actual = readme_block(README.read_text())
    assert actual == expected, ("README's results table differs from results/*.json: run `rlrobot results table` "
                                "(never edit the table by hand)")


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


def _fake_result(value: float) -> dict:
    per_seed = [{"seed": s, "figures": {"train.success": v}, "steps": [{"git_commit": "abcdef0123", "git_dirty": False,
                                                                        "returncode": 0, "wall_s": 60.0}],
                 "curve": {}, "wall_s": 60.0} for s, v in enumerate((value, 0.5))]
    return {"name": "ppo-so101-reach", "title": "PPO", "task": "so101-reach", "group": "headline", "budget": "b",
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
    assert "eval success **0.70** ± 0.28 (0.90, 0.50)" in block
    assert "`rlrobot results run --only sac-so101-reach`" in block  # registered, not run: listed, no figures
    assert block == results_block(load_results(tmp_path / "results"))  # the generated table passes the check
    edited = text.replace("**0.70**", "**0.75**")
    assert edited != text and readme_block(edited) != results_block(load_results(tmp_path / "results"))
    # a re-run that changes a figure changes the table
    other = copy.deepcopy(_fake_result(1.0))
    (tmp_path / "results" / "ppo-so101-reach.json").write_text(json.dumps(other))
    assert results_block(load_results(tmp_path / "results")) != block


def test_markers_are_required():
    with pytest.raises(ValueError, match="markers"):
        replace_block("# README without markers\n", "table")


def test_curves_png_per_task(tmp_path):
    from rlrobot.results.report import curve_file, plot_curves

    result = _fake_result(0.9)
    for i, p in enumerate(result["per_seed"]):
        p["curve"] = {"x": [100.0, 200.0], "y": [0.1 * i, 0.5 + 0.1 * i]}
    written = plot_curves([result], tmp_path)
    assert written == [tmp_path / curve_file("so101-reach")] and written[0].stat().st_size > 5_000
    assert "[so101-reach](results/curves_so101-reach.png)" in results_block([result])
