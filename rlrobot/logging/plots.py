"""Learning-curve PNG from metrics.jsonl."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .loggers import read_metrics  # noqa: E402


def plot_learning_curve(metrics_file: Path, out_png: Path, title: str = "") -> Path:
    rows = read_metrics(metrics_file)
    train = [r for r in rows if "train/return" in r]
    evals = [r for r in rows if "eval/success_rate" in r]
    fig, (ax_ret, ax_succ) = plt.subplots(1, 2, figsize=(10, 3.6))
    if train:
        ax_ret.plot([r["env_steps"] for r in train], [r["train/return"] for r in train], label="train return")
    if evals:
        ax_ret.plot([r["env_steps"] for r in evals], [r["eval/return_mean"] for r in evals], "o-", label="eval return")
        ax_succ.plot([r["env_steps"] for r in evals], [r["eval/success_rate"] for r in evals], "o-", label="eval")
    if train and "train/success" in train[0]:
        ax_succ.plot([r["env_steps"] for r in train], [r["train/success"] for r in train], alpha=0.6, label="train")
    ax_ret.set_xlabel("env steps")
    ax_ret.set_ylabel("episode return")
    ax_succ.set_xlabel("env steps")
    ax_succ.set_ylabel("success rate")
    ax_succ.set_ylim(-0.02, 1.02)
    for ax in (ax_ret, ax_succ):
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    out_png = Path(out_png)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png
