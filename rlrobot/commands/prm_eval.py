"""``rlrobot prm-eval``: a process reward model (``rlrobot train --algo prm``) on held-out LeRobotDatasets.

Per episode, the PRM's progress curve (VLAC value update over pairs (t - stride, t), V_0 = 0; a frame between two pair
ends takes the update from the last end before it, ``--curve causal``, or holds that end's value, ``--curve hold``,
the earlier curve) against the labels of
``rlrobot.data.progress_labels`` (time progress to the first success; relative dense progress for failures) and its done
probability against the done pseudo labels, one PNG of up to 16 episodes; and the metrics of issue 20:

- ``spearman_mean``: mean over episodes (with non-constant labels) of Spearman(predicted curve, true progress);
  ``spearman_success`` / ``spearman_failed`` split by outcome; target >= 0.9. ``spearman_anchored``: the same for
  the curve the ``prm:PATH`` reward uses as its potential, delta(s_0, s_t) of every frame from the episode's first
  (no accumulation of pair errors; it can fall with the task's progress); ``spearman_moving``: over the episodes
  whose true progress spans >= 0.05 (a flat failure's Spearman ranks label noise) — diagnostics beside the target;
- ``done_f1``: F1 of done_prob > the model's threshold against the per-frame done labels (all frames); target >= 0.9;
- ``reversed_total_mean``: each episode that made progress (true progress rose by >= 0.2) played backwards, the sum of
  its pair deltas (stride as above); target < 0 (``reversed_negative_share``: the share of such episodes below 0);
- ``mismatch_ratio``: mean |delta| of forward pairs under another instruction of the data / under the episode's own;
  target < 0.2; NaN (target ``None``: not measurable) on data with one instruction.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from rich.console import Console

console = Console(soft_wrap=True)
TARGETS = {"spearman_mean": (">=", 0.9), "done_f1": (">=", 0.9), "reversed_total_mean": ("<", 0.0),
           "mismatch_ratio": ("<", 0.2)}


@dataclass
class PRMEvalArgs:
    checkpoint: str
    """PRM run directory / checkpoint (rlrobot train --algo prm); RUN,RUN,... evaluates their ensemble (mean delta
    and done probability)"""
    dataset: str
    """held-out LeRobotDataset(s): DIR[,DIR...] or a folder of datasets"""
    out: str = ""
    """where metrics.json and progress_curves.png go ('' = <checkpoint run>/prm_eval)"""
    stride: int = 5
    """frames between the pairs of a progress curve"""
    curve: Literal["causal", "hold"] = "causal"
    """frames between two pair ends: the value update from the last end to the frame (causal), or that end's value
    (hold: the curve before 2026-12-06, which lags by up to a stride)"""
    device: str = "cpu"
    max_episodes: int = 0
    """evaluate only the first N episodes (0 = all)"""
    seed: int = 0
    """draws the mismatched instructions"""


def _f1(pred: np.ndarray, label: np.ndarray) -> float:
    tp = float((pred & label).sum())
    fp = float((pred & ~label).sum())
    fn = float((~pred & label).sum())
    return 2 * tp / max(2 * tp + fp + fn, 1e-9) if (tp + fp + fn) else 1.0


def _pair_deltas(model, obs: dict[str, torch.Tensor], emb: torch.Tensor, stride: int) -> torch.Tensor:
    length = len(emb)
    starts = torch.arange(0, max(length - stride, 0), stride, device=emb.device)
    ends = starts + stride
    if len(starts) == 0:
        starts, ends = torch.zeros(1, dtype=torch.long, device=emb.device), torch.full((1,), length - 1, device=emb.device)
    delta, _ = model.progress({k: v[starts] for k, v in obs.items()}, {k: v[ends] for k, v in obs.items()}, emb[ends])
    return delta


def evaluate_prm(model, data, stride: int = 5, out: str | Path | None = None, seed: int = 0, curve: str = "causal"
                 ) -> dict[str, Any]:
    """Metrics (module docstring) of ``model`` on ``data`` (a ``ProgressData``); PNG + metrics.json under ``out``."""
    from rlrobot.data.progress_labels import other_instruction, spearman
    from rlrobot.rewards.prm import progress_curve

    gen = torch.Generator(device=data.device).manual_seed(seed)
    rows: list[dict[str, Any]] = []
    curves = []
    pred_done, true_done = [], []
    matched, mismatched = [], []
    for e, (a, b) in enumerate(data.episodes()):
        idx = torch.arange(a, b, device=data.device)
        obs = data.frames(idx)
        emb = data.embedding(idx)
        values, done, _ = progress_curve(model, obs, emb, stride, curve)
        true = data.progress[idx].cpu().numpy()
        v = values.cpu().numpy()
        rho = spearman(v, true)
        anchored, _ = model.progress({k: x[:1].expand_as(x) for k, x in obs.items()}, obs, emb)
        rho_anchored = spearman(anchored.clamp_min(0.0).cpu().numpy(), true)
        pred_done.append(done.cpu().numpy() > model.done_threshold)
        true_done.append(data.done[idx].cpu().numpy())
        rev = {k: x.flip(0) for k, x in obs.items()}
        reversed_total = float(_pair_deltas(model, rev, emb.flip(0), stride).sum())
        forward = _pair_deltas(model, obs, emb, stride)
        wrong_id = other_instruction(data, data.instruction_id[idx[:1]], gen).expand(len(idx))
        wrong = _pair_deltas(model, data.frames(idx, wrong_id), data.instruction_embeddings[wrong_id], stride)
        matched.append(forward.abs().cpu())
        mismatched.append(wrong.abs().cpu())
        info = data.episode_info[e] if e < len(data.episode_info) else {}
        rows.append({"episode": e, "family": info.get("family"), "recipe": info.get("recipe"),
                     "success": bool(info.get("success", data.done[idx].any())), "length": int(b - a),
                     "spearman": rho, "spearman_anchored": rho_anchored, "final_value": float(v[-1]),
                     "moving": bool(true.max() - true.min() >= 0.05), "true_final": float(true[-1]),
                     "progressed": bool(true.max() - true[0] >= 0.2), "reversed_total": reversed_total,
                     "forward_total": float(forward.sum())})
        curves.append((v, true, done.cpu().numpy(), data.done[idx].cpu().numpy(), info))
    finite = [r for r in rows if np.isfinite(r["spearman"])]
    progressed = [r for r in rows if r["progressed"]]
    pd, td = np.concatenate(pred_done), np.concatenate(true_done)
    m_match, m_wrong = float(torch.cat(matched).mean()), float(torch.cat(mismatched).mean())
    if len(data.instructions) < 2:  # one instruction: nothing to mismatch with (other_instruction returns it)
        m_wrong = float("nan")

    def mean(xs: list[float]) -> float:
        return float(np.mean(xs)) if xs else float("nan")

    metrics = {
        "episodes": len(rows), "frames": len(data),
        "spearman_mean": mean([r["spearman"] for r in finite]),
        "spearman_success": mean([r["spearman"] for r in finite if r["success"]]),
        "spearman_failed": mean([r["spearman"] for r in finite if not r["success"]]),
        "spearman_episodes": len(finite),
        "spearman_anchored": mean([r["spearman_anchored"] for r in rows if np.isfinite(r["spearman_anchored"])]),
        "spearman_moving": mean([r["spearman"] for r in finite if r["moving"]]),
        "done_f1": _f1(pd, td), "done_precision": float((pd & td).sum() / max(pd.sum(), 1)),
        "done_recall": float((pd & td).sum() / max(td.sum(), 1)), "done_threshold": float(model.done_threshold),
        "reversed_total_mean": mean([r["reversed_total"] for r in progressed]),
        "forward_total_mean": mean([r["forward_total"] for r in progressed]),
        "reversed_negative_share": mean([float(r["reversed_total"] < 0) for r in progressed]),
        "reversed_episodes": len(progressed),
        "delta_abs_matched": m_match, "delta_abs_mismatched": m_wrong, "mismatch_ratio": m_wrong / max(m_match, 1e-9),
        "stride": stride, "curve": curve,
    }
    metrics["targets_met"] = {k: (None if not np.isfinite(metrics[k]) else metrics[k] >= t if op == ">=" else metrics[k] < t)
                              for k, (op, t) in TARGETS.items()}  # None: not measurable on this data
    result = {"metrics": metrics, "episodes": rows}
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "metrics.json").write_text(json.dumps(result, indent=2, default=float))
        result["plot"] = str(plot_curves(curves, out / "progress_curves.png", stride))
    return result


def plot_curves(curves: list, path: Path, stride: int, max_plots: int = 16) -> Path:
    """Up to ``max_plots`` episodes (successes and failures mixed in data order, evenly spaced)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pick = np.unique(np.linspace(0, len(curves) - 1, min(max_plots, len(curves))).astype(int))
    cols = 4
    rows = int(np.ceil(len(pick) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 2.6 * rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, i in zip(axes.flat, pick, strict=False):
        v, true, done, true_done, info = curves[i]
        ax.axis("on")
        t = np.arange(len(v))
        ax.plot(t, true, "k-", lw=1.5, label="true progress")
        ax.plot(t, v, "C0-", lw=1.5, label="PRM value (VLAC update)")
        ax.plot(t, done, "C3:", lw=1, label="PRM done prob")
        ax.fill_between(t, 0, true_done.astype(float), color="C2", alpha=0.12, step="mid", label="done label")
        ax.set_ylim(-0.05, 1.05)
        ax.set_title(f"{info.get('family', '')} {info.get('recipe', '')} {'ok' if info.get('success') else 'fail'}",
                     fontsize=9)
    axes.flat[0].legend(fontsize=7, loc="upper left")
    fig.suptitle(f"PRM progress on held-out episodes (pairs every {stride} frames)")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def run_prm_eval(args: PRMEvalArgs) -> dict[str, Any]:
    from rlrobot.checkpoints import resolve_checkpoint
    from rlrobot.data.progress_labels import load_progress_data
    from rlrobot.rewards.prm import load_progress_model

    if args.stride < 1:
        raise ValueError(f"stride must be >= 1, got {args.stride}")
    model = load_progress_model(args.checkpoint, args.device)
    shapes = {k: tuple(v) for k, v in model.observation_space.items()}
    data = load_progress_data(args.dataset, model.obs_keys, shapes, device=args.device, max_episodes=args.max_episodes)
    from rlrobot.rewards.prm import split_prm_paths
    from rlrobot.rewards.sarm import ADAPTER_FILE

    paths = split_prm_paths(args.checkpoint)
    sarm = (Path(paths[0]) / ADAPTER_FILE).is_file()  # a SARM adapter directory (the vla extra)
    ckpt = Path(paths[0]) if sarm else resolve_checkpoint(paths[0])
    default_out = ckpt / "prm_eval" if sarm else ckpt.parent.parent / "prm_eval"
    if len(paths) > 1:  # an ensemble: next to its first member's results, named by its size
        default_out = default_out.with_name(f"prm_eval_ensemble{len(paths)}")
        ckpt = Path(args.checkpoint)
    out = Path(args.out) if args.out else default_out
    result = evaluate_prm(model, data, args.stride, out, args.seed, args.curve)
    m = result["metrics"]
    console.print(f"PRM {ckpt} on {m['episodes']} episodes of {args.dataset}: Spearman {m['spearman_mean']:.3f} "
                  f"(success {m['spearman_success']:.3f}, failed {m['spearman_failed']:.3f}; anchored curve "
                  f"{m['spearman_anchored']:.3f}), done F1 {m['done_f1']:.3f}, "
                  f"reversed total {m['reversed_total_mean']:.3f} (forward {m['forward_total_mean']:.3f}, negative in "
                  f"{m['reversed_negative_share']:.2f}), mismatch |delta| ratio {m['mismatch_ratio']:.3f}; "
                  f"targets met {m['targets_met']}; {out}")
    return result
