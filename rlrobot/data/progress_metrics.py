"""How well a progress model tracks labelled episodes: what ``rlrobot prm-eval``, the PRM and SARM runs report.

Per episode, the model's progress curve (``progress_curve``: VLAC value update over pairs (t - stride, t), V_0 = 0; a
frame between two pair ends takes the update from the last end before it, ``curve="causal"``, or holds that end's
value, ``curve="hold"``) against the labels of ``rlrobot.data.progress_labels`` (time progress to the first success;
relative dense progress for failures) and its done probability against the done pseudo labels, one PNG of up to 16
episodes; and the metrics:

- ``spearman_mean``: mean over episodes (with non-constant labels) of Spearman(predicted curve, true progress);
  ``spearman_success`` / ``spearman_failed`` split by outcome; target >= 0.9. ``spearman_anchored``: the same for
  the curve the ``prm:PATH`` reward uses as its potential, delta(s_0, s_t) of every frame from the episode's first
  (no accumulation of pair errors; it can fall with the task's progress); ``spearman_moving``: over the episodes
  whose true progress spans >= 0.05 (a flat failure's Spearman ranks label noise) -- diagnostics beside the target;
- ``done_f1``: F1 of done_prob > the model's threshold against the per-frame done labels (all frames); target >= 0.9;
- ``reversed_total_mean``: each episode that made progress (true progress rose by >= 0.2) played backwards, the sum of
  its pair deltas (stride as above); target < 0 (``reversed_negative_share``: the share of such episodes below 0);
- ``mismatch_ratio``: mean |delta| of forward pairs under another instruction of the data / under the episode's own;
  target < 0.2; NaN (target ``None``: not measurable) on data with one instruction.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from rlrobot.data.progress_labels import ProgressData, other_instruction, spearman, value_update

TARGETS = {"spearman_mean": (">=", 0.9), "done_f1": (">=", 0.9), "reversed_total_mean": ("<", 0.0),
           "mismatch_ratio": ("<", 0.2)}


@torch.no_grad()
def progress_curve(model: Any, obs: dict[str, Tensor], instruction_embedding: Tensor, stride: int = 5,
                   curve: str = "causal") -> tuple[Tensor, Tensor, Tensor]:
    """One episode's progress curve by the value update over pairs (t - stride, t), V_0 = 0 (the chain of pair ends
    k = 0, stride, 2 stride, ..., last frame). A frame t between two pair ends: ``curve="causal"`` takes the update
    from the last end k before it, ``value_update(V_k, delta(s_k, s_t))`` (the next end's value is that same update,
    so the chain is unchanged and the in-between frames follow the episode); ``"hold"`` keeps V_k (it lags by up
    to a stride: with a perfect pair model it scores 0.858 instead of 1.0 Spearman on the held-out suite failures whose
    progress moves, stride 5). ``obs``: [T, ...] per key,
    ``instruction_embedding`` [384] or [T, 384]. Returns ([T] values, [T] done probabilities, [P] the chain's deltas)."""
    if curve not in ("causal", "hold"):
        raise ValueError(f"curve must be one of ('causal', 'hold'), got {curve!r}")
    length = len(next(iter(obs.values())))
    emb = instruction_embedding if instruction_embedding.dim() == 2 else instruction_embedding.expand(length, -1)
    frames = torch.arange(length, device=emb.device)
    anchor = (frames - 1).clamp_min(0) // stride * stride  # the last chain end strictly before each frame (frame 0: 0)
    delta_from_anchor, done = model.progress({k: v[anchor] for k, v in obs.items()}, obs, emb)
    ends = torch.cat([torch.arange(stride, length, stride, device=emb.device),
                      torch.tensor([length - 1], device=emb.device)]).unique() if length > 1 else frames[:0]
    chain = delta_from_anchor[ends]  # the pairs (previous end, end)
    anchor_value = torch.zeros(length, device=emb.device)
    v = torch.zeros((), device=emb.device)
    for end, d in zip(ends.tolist(), chain, strict=True):  # sequential by definition (T / stride steps, evaluation only)
        v = value_update(v, d)
        anchor_value[end + 1:] = v  # frames whose last end is `end` start from its value
    values = value_update(anchor_value, delta_from_anchor) if curve == "causal" else anchor_value.clone()
    if curve == "hold":
        values[ends] = value_update(anchor_value[ends], chain)  # a pair end holds its own value
    values[0] = 0.0
    return values, done, chain


def _f1(pred: np.ndarray, label: np.ndarray) -> float:
    tp = float((pred & label).sum())
    fp = float((pred & ~label).sum())
    fn = float((~pred & label).sum())
    return 2 * tp / max(2 * tp + fp + fn, 1e-9) if (tp + fp + fn) else 1.0


def _pair_deltas(model: Any, obs: dict[str, torch.Tensor], emb: torch.Tensor, stride: int) -> torch.Tensor:
    length = len(emb)
    starts = torch.arange(0, max(length - stride, 0), stride, device=emb.device)
    ends = starts + stride
    if len(starts) == 0:
        starts, ends = torch.zeros(1, dtype=torch.long, device=emb.device), torch.full((1,), length - 1, device=emb.device)
    delta, _ = model.progress({k: v[starts] for k, v in obs.items()}, {k: v[ends] for k, v in obs.items()}, emb[ends])
    return delta


def evaluate_progress_model(model: Any, data: ProgressData, stride: int = 5, out: str | Path | None = None, seed: int = 0,
                            curve: str = "causal") -> dict[str, Any]:
    """Metrics (module docstring) of ``model`` (a progress model: ``progress(obs_before, obs_after, instruction
    embedding)``, ``done_threshold``) on ``data``; PNG + metrics.json under ``out``."""
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
    import matplotlib  # only where a plot is written: its backend is chosen first, without a display

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
