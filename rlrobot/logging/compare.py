"""Several runs on one figure: a metric (evaluation success by default) against env steps and against training wall
clock, plus the table a comparison needs (final, best, and the steps / seconds each run took to first reach a level).

Evaluation rows carry no wall time; their wall time is interpolated from the training rows' ``time/wall`` at the same
step (both are logged at iteration ends, so this is exact up to the evaluation's own duration, which is not counted
as training time). A run's starting point (e.g. the SFT checkpoint's success) can be given as ``start``.

Switch points: vertical lines on the env-steps axis, given as ``marks`` ((step, label) pairs, ``--mark STEP:LABEL``), and
each run's own switch read from its config.json (``warm_start.switch_step``: the env step where a warm start's
updates begin, written by rlrobot.runners.warm_start), drawn in the run's colour on both axes.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.ticker import FuncFormatter

from .loggers import read_metrics
from .plots import _SERIES_COLORS, EVAL_COLOR, TRAIN_COLOR, format_count, metric_rows, plt

COLORS = (TRAIN_COLOR, EVAL_COLOR, *_SERIES_COLORS)


@dataclass
class RunCurve:
    label: str
    steps: list[float]
    wall: list[float]
    values: list[float]
    switch: tuple[float, float] | None = None
    """(env step, training wall seconds) of the run's switch point (config.json ``warm_start.switch_step``)"""

    def first_reaching(self, level: float) -> tuple[float, float] | None:
        """(env steps, wall seconds) of the first point at or above ``level``."""
        for s, w, v in zip(self.steps, self.wall, self.values, strict=True):
            if v >= level:
                return s, w
        return None


def run_curve(run_dir: str | Path, label: str, metric: str = "eval/success_rate", start: float | None = None) -> RunCurve:
    rows = metric_rows(read_metrics(Path(run_dir) / "metrics.jsonl"))
    if not rows:
        raise FileNotFoundError(f"{run_dir} has no metrics.jsonl rows (is it a run directory?)")
    timed = [(s, float(r["time/wall"])) for s, r in rows if isinstance(r.get("time/wall"), (int, float))]
    timed_steps = [s for s, _ in timed]

    def wall_at(step: float) -> float:
        if not timed:
            return float("nan")
        i = bisect.bisect_left(timed_steps, step)
        if i < len(timed) and timed[i][0] == step:
            return timed[i][1]
        lo = timed[i - 1] if i > 0 else (0.0, 0.0)
        hi = timed[min(i, len(timed) - 1)]
        if hi[0] == lo[0]:
            return hi[1]
        return lo[1] + (hi[1] - lo[1]) * (step - lo[0]) / (hi[0] - lo[0])

    curve = RunCurve(label, [], [], [])
    if start is not None:
        curve.steps.append(0.0), curve.wall.append(0.0), curve.values.append(float(start))
    for step, row in rows:
        value = row.get(metric)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            curve.steps.append(step)
            curve.wall.append(wall_at(step))
            curve.values.append(float(value))
    if len(curve.values) == (start is not None):
        raise ValueError(f"{run_dir} logged no {metric!r}; metrics it has: "
                         f"{sorted({k for _, r in rows for k in r})[:12]}")
    switch = run_switch_step(run_dir)
    if switch is not None:
        curve.switch = (switch, wall_at(switch))
    return curve


def run_switch_step(run_dir: str | Path) -> float | None:
    """The env step where a warm start's learning begins (config.json ``warm_start.switch_step``), if it has one."""
    import json

    path = Path(run_dir) / "config.json"
    if not path.is_file():
        return None
    step = (json.loads(path.read_text()).get("warm_start") or {}).get("switch_step")
    return float(step) if isinstance(step, (int, float)) else None


def parse_mark(text: str) -> tuple[float, str]:
    """``STEP:LABEL`` (``5000:online``; the label may be empty) -> (5000.0, 'online')."""
    step, _, label = text.partition(":")
    try:
        return float(step.replace("_", "")), label
    except ValueError:
        raise ValueError(f"mark={text!r} is not STEP:LABEL (e.g. 5000:online)") from None


def comparison_table(curves: list[RunCurve], level: float) -> list[dict[str, Any]]:
    table = []
    for c in curves:
        reached = c.first_reaching(level)
        table.append({"run": c.label, "final": c.values[-1], "best": max(c.values), "env_steps": c.steps[-1],
                      "wall_s": c.wall[-1], f"steps_to_{level:g}": reached[0] if reached else None,
                      f"wall_s_to_{level:g}": reached[1] if reached else None})
    return table


def comparison_figure(curves: list[RunCurve], metric: str, title: str = "", level: float | None = None,
                      marks: tuple[tuple[float, str], ...] = ()):
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for i, c in enumerate(curves):
        color = COLORS[i % len(COLORS)]
        for ax, xs in ((axes[0], c.steps), (axes[1], c.wall)):
            ax.plot(xs, c.values, "o-", color=color, label=c.label, markersize=3.5, linewidth=1.2)
        if c.switch is not None:  # the run's own switch point, in its colour
            for ax, x in zip(axes, c.switch, strict=True):
                ax.axvline(x, color=color, linestyle="--", linewidth=1, alpha=0.8)
    for step, label in marks:
        axes[0].axvline(step, color="black", linestyle="--", linewidth=1)
        if label:
            axes[0].annotate(label, (step, 1.0), xycoords=("data", "axes fraction"), xytext=(3, -12),
                             textcoords="offset points", fontsize=8)
    for ax, xlabel in ((axes[0], "env steps"), (axes[1], "training wall clock (s)")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel(metric)
        if "success" in metric:
            ax.set_ylim(-0.03, 1.03)
        if level is not None:
            ax.axhline(level, color="gray", linestyle=":", linewidth=1)
        ax.xaxis.set_major_formatter(FuncFormatter(format_count))
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def write_comparison(curves: list[RunCurve], out_png: str | Path, metric: str, title: str = "",
                     level: float | None = None, marks: tuple[tuple[float, str], ...] = ()) -> Path:
    fig = comparison_figure(curves, metric, title, level, marks)
    out_png = Path(out_png)
    try:
        fig.savefig(out_png, dpi=110)
    finally:
        plt.close(fig)
    return out_png
