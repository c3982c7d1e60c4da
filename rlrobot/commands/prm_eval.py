"""``rlrobot prm-eval``: a process reward model (``rlrobot train --algo prm`` or ``--algo sarm``) on held-out
LeRobotDatasets, with the metrics and curves of ``rlrobot.data.progress_metrics`` (Spearman of the progress curve,
done F1, reversed and mismatched checks)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rich.console import Console

from rlrobot.checkpoints import resolve_checkpoint
from rlrobot.data.progress_labels import load_progress_data, recorded_task, task_instruction_observation
from rlrobot.data.progress_metrics import evaluate_progress_model
from rlrobot.rewards.progress_model import load_progress_model, split_prm_paths
from rlrobot.rewards.sarm import ADAPTER_FILE

console = Console(soft_wrap=True)


@dataclass
class PRMEvalArgs:
    checkpoint: str
    """PRM run directory / checkpoint (rlrobot train --algo prm or --algo sarm); RUN,RUN,... evaluates their ensemble
    (mean delta and done probability)"""
    dataset: str
    """held-out LeRobotDataset(s): DIR[,DIR...] or a folder of datasets"""
    out: str = ""
    """where metrics.json and progress_curves.png go ('' = <checkpoint run>/prm_eval)"""
    stride: int = 5
    """frames between the pairs of a progress curve"""
    curve: Literal["causal", "hold"] = "causal"
    """frames between two pair ends: the value update from the last end to the frame (causal), or that end's value
    (hold, which lags by up to a stride)"""
    device: str = "cpu"
    max_episodes: int = 0
    """evaluate only the first N episodes (0 = all)"""
    seed: int = 0
    """draws the mismatched instructions"""


def run_prm_eval(args: PRMEvalArgs) -> dict[str, Any]:
    """Evaluate the model(s) of ``args.checkpoint`` on ``args.dataset``; metrics.json and the curves' PNG under
    ``args.out``."""
    if args.stride < 1:
        raise ValueError(f"stride must be >= 1, got {args.stride}")
    model = load_progress_model(args.checkpoint, args.device)
    shapes = {k: tuple(v) for k, v in model.observation_space.items()}
    data = load_progress_data(args.dataset, model.obs_keys, shapes, device=args.device, max_episodes=args.max_episodes,
                              instruction_observation=task_instruction_observation(recorded_task(args.dataset)))
    paths = split_prm_paths(args.checkpoint)
    sarm = (Path(paths[0]) / ADAPTER_FILE).is_file()  # a SARM adapter directory, saved outside a run directory
    ckpt = Path(paths[0]) if sarm else resolve_checkpoint(paths[0])
    default_out = ckpt / "prm_eval" if sarm else ckpt.parent.parent / "prm_eval"
    if len(paths) > 1:  # an ensemble: next to its first member's results, named by its size
        default_out = default_out.with_name(f"prm_eval_ensemble{len(paths)}")
        ckpt = Path(args.checkpoint)
    out = Path(args.out) if args.out else default_out
    result = evaluate_progress_model(model, data, args.stride, out, args.seed, args.curve)
    m = result["metrics"]
    console.print(f"PRM {ckpt} on {m['episodes']} episodes of {args.dataset}: Spearman {m['spearman_mean']:.3f} "
                  f"(success {m['spearman_success']:.3f}, failed {m['spearman_failed']:.3f}; anchored curve "
                  f"{m['spearman_anchored']:.3f}), done F1 {m['done_f1']:.3f}, "
                  f"reversed total {m['reversed_total_mean']:.3f} (forward {m['forward_total_mean']:.3f}, negative in "
                  f"{m['reversed_negative_share']:.2f}), mismatch |delta| ratio {m['mismatch_ratio']:.3f}; "
                  f"targets met {m['targets_met']}; {out}")
    return result
