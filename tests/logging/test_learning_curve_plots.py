"""The learning-curve PNG: readable step ticks, one colour per series in every panel, loss panels, eval markers."""

from __future__ import annotations

import json

import matplotlib.pyplot as plt
import pytest
from matplotlib.colors import to_hex

from rlrobot.logging.loggers import read_metrics
from rlrobot.logging.plots import format_count, learning_curve_figure, plot_learning_curve


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _ppo_rows():
    """A PPO-like run: 1.6M env steps in 100 iterations, train/* only once episodes finished, evals every 25."""
    rows = []
    for i in range(1, 101):
        step = i * 16_000
        row = {"env_steps": step, "perf/env_steps_per_s": 5000.0, "time/wall": float(i),
               "loss/policy_loss": -0.01 * i, "loss/value_loss": 1.0 / i, "loss/entropy": 2.0 - 0.01 * i,
               "loss/kl": 0.01 + 1e-4 * i, "loss/clip_fraction": 0.1 + 1e-3 * i, "loss/lr": 1e-3 * 0.99 ** i,
               "loss/action_std": 1.0 - 0.005 * i, "loss/learner_steps": 16_000.0}  # the last never moves: no panel
        if i >= 3:  # no episode finished in the first two iterations: nothing measured, nothing logged
            row.update({"train/return": 0.1 * i, "train/success": i / 100})
        rows.append(row)
        if i % 25 == 0:
            rows.append({"env_steps": step, "eval/success_rate": i / 100, "eval/return_mean": 0.12 * i})
    return rows


def _sft_rows():
    """An SFT-like run: steps are gradient updates; flow-matching loss and lr, evals; no train/return."""
    rows = [{"env_steps": u, "loss/flow_matching": 1.0 / u, "loss/lr": 3e-4 * (1 - u / 4000)} for u in range(100, 2001, 100)]
    rows.insert(10, {"env_steps": 1000, "eval/success_rate": 0.2, "eval/return_mean": 10.0})
    rows.append({"env_steps": 2000, "eval/success_rate": 0.4, "eval/return_mean": 20.0})
    return rows


def _axes(fig):
    return {ax.get_title(): ax for ax in fig.axes if ax.get_visible()}


def _colors(ax):
    return {line.get_label(): to_hex(line.get_color()) for line in ax.get_lines()}


def _xticks(fig, ax):
    fig.canvas.draw()
    return [t.get_text() for t in ax.get_xticklabels()]


@pytest.mark.parametrize(("value", "text"), [(0, "0"), (950, "950"), (1500, "1.5k"), (500_000, "500k"),
                                             (1_200_000, "1.2M"), (1_250_000, "1.25M"), (12_000_000, "12M"),
                                             (3e9, "3B"), (0.5, "0.5"), (-2000, "-2k")])
def test_format_count(value, text):
    assert format_count(value) == text


def test_ppo_curve(tmp_path):
    metrics = _write(tmp_path / "metrics.jsonl", _ppo_rows())
    png = plot_learning_curve(metrics, tmp_path / "curve.png", title="so101-lift")
    assert png.is_file() and png.stat().st_size > 10_000

    fig = learning_curve_figure(read_metrics(metrics), title="so101-lift")
    try:
        axes = _axes(fig)
        assert list(axes) == ["return", "success", "policy loss", "value loss", "update size", "exploration", "learning rate"]
        ticks = _xticks(fig, axes["return"])
        assert "1.2M" in ticks and "400k" in ticks, ticks
        assert all(ax.get_xlabel() == "env steps" for ax in axes.values())
        # the same colour per series in every panel; eval drawn as markers, train as a line
        assert _colors(axes["return"])["train"] == _colors(axes["success"])["train"]
        assert _colors(axes["return"])["eval"] == _colors(axes["success"])["eval"]
        assert _colors(axes["return"])["train"] != _colors(axes["return"])["eval"]
        eval_line = next(li for li in axes["success"].get_lines() if li.get_label() == "eval")
        train_line = next(li for li in axes["success"].get_lines() if li.get_label() == "train")
        assert eval_line.get_marker() == "o" and train_line.get_marker() in ("None", "", None)
        assert list(eval_line.get_xdata()) == [400_000, 800_000, 1_200_000, 1_600_000]
        # train/* appears only from the first iteration that measured it: no fake 0.0 at the start
        assert train_line.get_xdata()[0] == 48_000
        # every loss/* key plotted, each in one panel, all colours distinct
        loss_labels = [li.get_label() for t, ax in axes.items() if t not in ("return", "success") for li in ax.get_lines()]
        assert sorted(loss_labels) == ["action_std", "clip_fraction", "entropy", "kl", "lr", "policy_loss", "value_loss"]
        all_colors = {label: c for ax in axes.values() for label, c in _colors(ax).items()}
        assert len(set(all_colors.values())) == len(all_colors)
    finally:
        plt.close(fig)


def test_sft_curve_against_updates(tmp_path):
    metrics = _write(tmp_path / "metrics.jsonl", _sft_rows())
    png = plot_learning_curve(metrics, tmp_path / "curve.png", title="sft", x_label="gradient updates")
    assert png.is_file() and png.stat().st_size > 10_000

    fig = learning_curve_figure(read_metrics(metrics), x_label="gradient updates")
    try:
        axes = _axes(fig)
        assert list(axes) == ["return", "success", "flow-matching loss", "learning rate"]
        assert [li.get_label() for li in axes["return"].get_lines()] == ["eval"]  # no train/return was measured
        assert [li.get_label() for li in axes["flow-matching loss"].get_lines()] == ["flow_matching"]
        assert all(ax.get_xlabel() == "gradient updates" for ax in axes.values())
        assert "1k" in _xticks(fig, axes["success"])  # the eval-only panel spans the whole run too
        assert _colors(axes["return"])["eval"] == _colors(axes["success"])["eval"]
    finally:
        plt.close(fig)


def test_resumed_run_never_goes_back_in_time(tmp_path):
    # iterations 1-5 logged, the run resumed from the checkpoint at step 3: the rows of steps 4-5 were lost work
    rows = [{"env_steps": s, "train/return": float(s)} for s in (1, 2, 3, 4, 5)]
    rows += [{"env_steps": s, "train/return": 10.0 + s} for s in (4, 5, 6)]
    fig = learning_curve_figure(rows)
    try:
        line = _axes(fig)["return"].get_lines()[0]
        assert list(line.get_xdata()) == [1, 2, 3, 4, 5, 6]
        assert list(line.get_ydata()) == [1, 2, 3, 14, 15, 16]
    finally:
        plt.close(fig)


def test_empty_metrics(tmp_path):
    png = plot_learning_curve(tmp_path / "missing.jsonl", tmp_path / "curve.png")
    assert png.is_file()
