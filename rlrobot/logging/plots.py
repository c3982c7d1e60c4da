"""Learning-curve PNG from metrics.jsonl.

Each row of metrics.jsonl is ``{"env_steps": N, <metric>: value, ...}`` (a row keyed ``"step"`` is read too); N is
the x coordinate, in the unit the caller names with ``x_label`` (env steps for RL, gradient updates for SFT).
Panels, each drawn only when one of its series was measured at least once:

- return: ``train/return`` (line; with a shaped reward also ``train/task_return``) and ``eval/return_mean`` (markers);
- success: ``train/success`` and ``eval/success_rate``;
- one panel per group of ``loss/*`` keys (``LOSS_GROUPS``: flow-matching loss, policy loss, value loss, update size,
  exploration: entropy, action std and SAC's temperature, Q values, learning rate); any other ``loss/*`` key gets a
  panel of its own; a ``loss/*`` series that never moves gets none.

A series keeps one colour in every panel (train is always blue, eval orange and drawn as markers on a dashed line).
Rows of iterations that a resume went back past (the step decreases) are dropped, so the curve never runs back in time.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FuncFormatter, MaxNLocator  # noqa: E402

from .loggers import read_metrics  # noqa: E402

TRAIN_COLOR = "tab:blue"
EVAL_COLOR = "tab:orange"
# colours of the loss/* series, assigned in order of first appearance (blue and orange are train and eval's)
_SERIES_COLORS = ("tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan", "tab:gray",
                  "black", "gold", "navy", "teal")

# (panel title, the loss/* keys it holds): the first group a key is named in takes it
LOSS_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("flow-matching loss", ("flow_matching",)),
    ("policy loss", ("policy_loss", "actor_loss")),
    ("value loss", ("value_loss", "critic_loss")),
    ("update size", ("kl", "approx_kl", "clip_fraction", "first_ratio_max_deviation")),
    ("exploration", ("entropy", "action_std", "alpha", "alpha_loss")),
    ("Q values", ("q_mean",)),
    ("learning rate", ("lr",)),
)


def format_count(value: float, _pos: Any = None) -> str:
    """A tick label for a count: 0, 950, 1.5k, 500k, 1.2M, 3B."""
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    value = abs(value)
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return sign + f"{value / scale:.2f}".rstrip("0").rstrip(".") + suffix
    return sign + (f"{value:.0f}" if float(value).is_integer() else f"{value:.3g}")


def _step(row: dict[str, Any]) -> float | None:
    step = row.get("step", row.get("env_steps"))
    return float(step) if isinstance(step, (int, float)) and not isinstance(step, bool) else None


def metric_rows(rows: list[dict[str, Any]]) -> list[tuple[float, dict[str, Any]]]:
    """(step, row) in log order, without rows lacking a step and without rows a later resume went back past."""
    kept: list[tuple[float, dict[str, Any]]] = []
    for row in rows:
        step = _step(row)
        if step is None:
            continue
        if kept and step < kept[-1][0]:
            kept = [(s, r) for s, r in kept if s < step]
        kept.append((step, row))
    return kept


def _series(rows: list[tuple[float, dict[str, Any]]], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for step, row in rows:
        value = row.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            xs.append(step)
            ys.append(float(value))
    return xs, ys


def _constant(rows: list[tuple[float, dict[str, Any]]], key: str) -> bool:
    """A series that never moves over three or more points (e.g. the learner's share without a curriculum): no panel."""
    values = {float(row[key]) for _, row in rows if key in row and row[key] is not None}
    return len(values) == 1 and sum(key in row for _, row in rows) >= 3


def _panels(rows: list[tuple[float, dict[str, Any]]]) -> list[tuple[str, str, list[tuple[str, str]]]]:
    """[(title, y label, [(metric key, series label), ...])] for the series present in ``rows``."""
    present = {key for _, row in rows for key in row}
    panels = []
    for title, ylabel, series in (("return", "episode return", [("train/return", "train"), ("train/task_return", "train, task's"),
                                                                ("eval/return_mean", "eval")]),
                                  ("success", "success rate", [("train/success", "train"), ("eval/success_rate", "eval")])):
        series = [s for s in series if s[0] in present]
        if series:
            panels.append((title, ylabel, series))
    losses = sorted(k[len("loss/"):] for k in present if k.startswith("loss/") and not _constant(rows, k))
    taken: set[str] = set()
    for title, names in LOSS_GROUPS:
        group = [n for n in names if n in losses]
        if group:
            taken.update(group)
            panels.append((title, "", [(f"loss/{n}", n) for n in group]))
    panels.extend((name, "", [(f"loss/{name}", name)]) for name in losses if name not in taken)
    return panels


def learning_curve_figure(rows: list[dict[str, Any]], title: str = "", x_label: str = "env steps") -> Figure:
    """The learning-curve figure of metrics rows (read_metrics's output); the caller saves and closes it."""
    kept = metric_rows(rows)
    panels = _panels(kept)
    n = max(1, len(panels))
    ncols = 2 if n == 4 else min(n, 3)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.3 * ncols, 3.3 * nrows + 0.4), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[len(panels):]:
        ax.set_visible(False)
    if not panels:
        flat[0].set_visible(True)
        flat[0].axis("off")
        flat[0].text(0.5, 0.5, "no metrics logged", ha="center", va="center")
    colors = {"train": TRAIN_COLOR, "eval": EVAL_COLOR}
    steps = [step for step, _ in kept]
    xlim = (min(0.0, min(steps)), max(steps) * 1.02) if steps and max(steps) > 0 else None
    for ax, (panel_title, ylabel, series) in zip(flat, panels, strict=False):
        for key, label in series:
            xs, ys = _series(kept, key)
            if label not in colors:
                colors[label] = _SERIES_COLORS[(len(colors) - 2) % len(_SERIES_COLORS)]
            if label == "eval":
                ax.plot(xs, ys, "o--", color=colors[label], label=label, markersize=5, markeredgecolor="black",
                        markeredgewidth=0.6, linewidth=1.0, zorder=3)
            else:
                ax.plot(xs, ys, "-", color=colors[label], label=label, linewidth=1.3, zorder=2)
        ax.set_title(panel_title, fontsize=10)
        if xlim is not None:  # every panel spans the whole run, also one with a single eval point
            ax.set_xlim(*xlim)
        ax.set_xlabel(x_label)
        if ylabel:
            ax.set_ylabel(ylabel)
        if panel_title == "success":
            ax.set_ylim(-0.03, 1.03)
        if panel_title == "learning rate":
            ax.set_yscale("log")
        ax.xaxis.set_major_locator(MaxNLocator(nbins=5, min_n_ticks=3))
        ax.xaxis.set_major_formatter(FuncFormatter(format_count))
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_learning_curve(metrics_file: Path, out_png: Path, title: str = "", x_label: str = "env steps") -> Path:
    """Write the learning curve of ``metrics_file`` (a metrics.jsonl) to ``out_png``; x_label names the step's unit."""
    fig = learning_curve_figure(read_metrics(metrics_file), title=title, x_label=x_label)
    out_png = Path(out_png)
    try:
        fig.savefig(out_png, dpi=110)
    finally:
        plt.close(fig)
    return out_png
