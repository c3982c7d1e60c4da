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


def test_switch_points_from_config_and_marks(tmp_path):
    from rlrobot.logging.compare import comparison_figure, run_curve

    warm = write_run(tmp_path / "warm", {2000: 0.5, 4000: 0.95}, seconds_per_1k=2.0)
    (tmp_path / "warm" / "config.json").write_text(json.dumps({"warm_start": {"switch_step": 1500}}))
    cold = write_run(tmp_path / "cold", {2000: 0.2}, seconds_per_1k=1.0)
    curves = [run_curve(warm, "warm"), run_curve(cold, "cold")]
    assert curves[0].switch == (1500.0, 3.0) and curves[1].switch is None  # its wall clock interpolated
    fig = comparison_figure(curves, "eval/success_rate", marks=((2500.0, "online"),))
    lines = [[tuple(line.get_xdata()) for line in ax.get_lines() if line.get_linestyle() == "--"] for ax in fig.axes]
    assert lines == [[(1500.0, 1500.0), (2500.0, 2500.0)], [(3.0, 3.0)]]  # steps axis: the run's and the mark; wall: the run's
    table = run_compare(CompareArgs(runs=(warm, cold), mark=("2_500:online",), out=str(tmp_path / "m.png")))
    assert len(table) == 2 and (tmp_path / "m.png").is_file()
    with pytest.raises(ValueError, match=r"mark='x:online' is not STEP:LABEL"):
        run_compare(CompareArgs(runs=(warm,), mark=("x:online",), out=str(tmp_path / "x.png")))
