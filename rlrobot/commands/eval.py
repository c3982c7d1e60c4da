"""``rlrobot eval``: a checkpoint or run directory evaluated in its task (by default on the episodes its run's own
final evaluation used, so the same checkpoint scores the same), with the chunk policies' timing."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

import rlrobot
from rlrobot.checkpoints import load_checkpoint
from rlrobot.config import config_from_checkpoint
from rlrobot.envs.seeds import evaluation_seed
from rlrobot.policies.registry import build_policy, check_compatible, policy_metadata
from rlrobot.runners.evaluation import evaluate
from rlrobot.tasks.registry import validate_task_id

console = Console(soft_wrap=True)


@dataclass
class EvalArgs:
    checkpoint: str
    """a checkpoint directory or a run directory (its latest checkpoint is used)"""
    episodes: int | None = None
    """episodes to evaluate (default: the run's eval_episodes)"""
    num_envs: int | None = None
    """envs stepped at once (default: the run's eval_envs)"""
    task: str | None = None
    """evaluate on another task than the one trained on (its spaces must match)"""
    seed: int | None = None
    """evaluation seed (default: the one the run's own final evaluation used, so the same checkpoint scores the same)"""
    video: bool = True
    out: str | None = None
    """where to write eval.json and the video (default: the checkpoint directory)"""
    device: str = "cpu"
    denoising_steps: int | None = None
    """flow policies: denoising steps K to sample with (default: the run's)"""
    execute_steps: int | None = None
    """flow policies: actions of each chunk executed open-loop before re-planning (default: the run's)"""


def evaluate_checkpoint(args: EvalArgs) -> dict:
    import torch

    for name in ("episodes", "num_envs"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(args, name)}")
    weights, saved, ckpt = load_checkpoint(args.checkpoint)
    cfg = config_from_checkpoint(saved)
    _override_flow_sampling(cfg, args)
    # the run's final evaluation: env seed cfg.seed + 1, episode seed from the evaluation stream (rlrobot.envs.seeds)
    episodes = args.episodes or cfg.eval_episodes
    num_envs = args.num_envs or cfg.eval_envs
    seed = evaluation_seed(cfg.seed) if args.seed is None else args.seed
    env_seed = cfg.seed + 1 if args.seed is None else args.seed
    if args.task is not None:
        validate_task_id(args.task)
        cfg.task = args.task
    env = rlrobot.make(cfg.task, num_envs, backend=cfg.backend if args.task is None else None,
                       device=args.device, seed=env_seed, **cfg.task_options())
    try:
        check_compatible(saved, policy_metadata(cfg, env))
        policy = build_policy(saved, cfg)
        policy.load_state_dict(weights)
        policy.to(torch.device(args.device)).eval()
        out = Path(args.out) if args.out else ckpt
        out.mkdir(parents=True, exist_ok=True)
        result = evaluate(policy, env, episodes, seed=seed, video_path=out / "eval.mp4" if args.video else None)
        if hasattr(policy, "sample_actions"):
            result.update(chunk_timing(policy, env, seed))
    finally:
        env.close()
    same_as_run = args.seed is None and episodes == cfg.eval_episodes and num_envs == cfg.eval_envs and args.task is None
    result = {"checkpoint": str(ckpt), "task": cfg.task, "seed": seed, "num_envs": num_envs, **result}
    (out / "eval.json").write_text(json.dumps(result, indent=2))
    console.print(f"{cfg.task}: success {result['success_rate']:.3f}, return {result['return_mean']:.2f} "
                  f"+- {result['return_std']:.2f} over {result['episodes']} episodes", soft_wrap=True)
    for family, row in result.get("per_family", {}).items():
        console.print(f"  {family}: success {row['success_rate']:.3f} over {row['episodes']} episodes", soft_wrap=True)
    if "chunk_latency_ms" in result:
        calls = result["length_mean"] / result["execute_steps"]
        sampler = (f"K={result['denoising_steps']:.0f} denoising steps" if "denoising_steps" in result
                   else "autoregressive action tokens")
        console.print(f"  chunks: {sampler}, {result['execute_steps']:.0f} of "
                      f"{policy.chunk_size} actions executed ({result['chunk_utilisation']:.0%}), {calls:.1f} policy calls per "
                      f"episode, {result['chunk_latency_ms']:.2f} ms per chunk (batch 1)", soft_wrap=True)
    if "steps_to_success_mean" in result:
        console.print(f"  physical steps to first success: {result['steps_to_success_mean']:.1f} (mean over successful "
                      "episodes)", soft_wrap=True)
    if same_as_run:
        console.print("  same seed, episodes and envs as the run's own final evaluation: the latest checkpoint scores "
                      "what the run reported", soft_wrap=True)
    else:
        console.print(f"  seed {seed}, {episodes} episodes, {num_envs} envs: other episodes than the run's own final "
                      f"evaluation (seed {evaluation_seed(cfg.seed)}, {cfg.eval_episodes} episodes, {cfg.eval_envs} envs), so the "
                      "numbers differ by sampling", soft_wrap=True)
    console.print(f"  wrote {out / 'eval.json'}" + (f" and {result['video']}" if "video" in result else ""), soft_wrap=True)
    return result


def _override_flow_sampling(cfg, args: EvalArgs) -> None:
    if args.denoising_steps is None and args.execute_steps is None:
        return
    if not hasattr(cfg, "flow"):
        raise ValueError(f"--denoising-steps / --execute-steps apply to flow policies; {args.checkpoint} holds a "
                         f"{cfg.spec.policy_kind!r} policy")
    if args.denoising_steps is not None:
        if args.denoising_steps < 1:
            raise ValueError(f"denoising_steps must be >= 1, got {args.denoising_steps}")
        cfg.flow.denoising_steps = args.denoising_steps
    if args.execute_steps is not None:
        if not 1 <= args.execute_steps <= cfg.flow.chunk_size:
            raise ValueError(f"execute_steps must be in [1, chunk_size={cfg.flow.chunk_size}], got {args.execute_steps}")
        cfg.flow.execute_steps = args.execute_steps


def chunk_timing(policy, env, seed: int, calls: int = 50) -> dict[str, float]:
    """Latency of one deterministic chunk for one observation (what serving pays per re-plan), and chunk use."""

    import torch

    obs, _ = env.reset(seed=seed)
    one = {k: v[:1] for k, v in obs.items()}
    with torch.inference_mode():
        policy.sample_actions(one)  # warm-up
        start = time.perf_counter()
        for _ in range(calls):
            policy.sample_actions(one)
    execute = getattr(policy, "execute_steps", None) or policy.chunk_size
    timing = {"chunk_latency_ms": (time.perf_counter() - start) / calls * 1e3, "execute_steps": float(execute),
              "chunk_utilisation": execute / policy.chunk_size}
    if hasattr(policy, "denoising_steps"):  # flow policies (a token VLA decodes its chunk autoregressively)
        timing["denoising_steps"] = float(policy.denoising_steps)
    return timing
