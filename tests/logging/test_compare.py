"""rlrobot compare: eval points get the training wall clock of their step, the table finds the first step and second
at which a run reached the level, and bad arguments are refused before anything is read."""

import json

import pytest

from rlrobot.commands.compare import CompareArgs, run_compare


def write_run(path, evals, seconds_per_1k):
    path.mkdir()
    rows = []
    for step in range(1000, 6000, 1000):
        rows.append({"env_steps": step, "time/wall": step / 1000 * seconds_per_1k, "loss/x": 1.0})
        if step in evals:
            rows.append({"env_steps": step, "eval/success_rate": evals[step]})
    (path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


def test_table_and_figure(tmp_path):
    fast = write_run(tmp_path / "fast", {2000: 0.5, 4000: 0.95, 5000: 0.9}, seconds_per_1k=2.0)
    slow = write_run(tmp_path / "slow", {2000: 0.2, 5000: 0.6}, seconds_per_1k=1.0)
    table = run_compare(CompareArgs(runs=(fast, slow), labels=("a", "b"), level=0.9, start=(0.1, 0.1),
                                    out=str(tmp_path / "c.png"), json_out=str(tmp_path / "c.json")))
    a, b = table
    assert (a["final"], a["best"], a["steps_to_0.9"], a["wall_s_to_0.9"]) == (0.9, 0.95, 4000, 8.0)
    assert b["steps_to_0.9"] is None and b["best"] == 0.6 and b["wall_s"] == 5.0
    assert (tmp_path / "c.png").stat().st_size > 10_000
    assert json.loads((tmp_path / "c.json").read_text()) == table


def test_bad_arguments(tmp_path):
    run = write_run(tmp_path / "r", {1000: 0.1}, 1.0)
    with pytest.raises(ValueError, match="labels: 1 labels for 2 runs"):
        run_compare(CompareArgs(runs=(run, run), labels=("x",)))
    with pytest.raises(ValueError, match="logged no 'eval/return'"):
        run_compare(CompareArgs(runs=(run,), metric="eval/return", out=str(tmp_path / "x.png")))
    with pytest.raises(FileNotFoundError, match="no metrics.jsonl"):
        run_compare(CompareArgs(runs=(str(tmp_path),), out=str(tmp_path / "x.png")))
