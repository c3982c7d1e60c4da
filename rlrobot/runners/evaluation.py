"""Deterministic evaluation: success rate, mean return, and a video of env 0.

Action-chunk policies (anything with ``sample_actions``) run open-loop for ``execute_steps`` actions of each chunk,
then re-plan; an env whose episode ends re-plans at once from its new episode's first observation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlrobot.envs.vec_env import VecEnv
from rlrobot.envs.wrappers import VideoRecorder


@torch.inference_mode()
def evaluate(policy, env: VecEnv, episodes: int, seed: int = 10_000, video_path: Path | None = None,
             video_episodes: int = 2, deterministic: bool = True) -> dict[str, Any]:
    """Run until ``episodes`` episodes have finished (the first ones finished, across envs)."""
    recorder = VideoRecorder(env, 0, video_episodes) if video_path is not None and hasattr(env, "render") else None
    if recorder is not None:
        env = recorder
    obs, _ = env.reset(seed=seed)
    returns: list[float] = []
    lengths: list[int] = []
    success: list[bool] = []
    families: list[str] = []
    instructions: list[str] = []
    family_names = getattr(env, "family_names", None)
    max_iters = episodes * env.max_episode_steps + env.max_episode_steps  # bounded even if envs never finish
    chunked = ChunkedActor(policy, env.num_envs) if hasattr(policy, "sample_actions") else None
    # physical steps until each episode first succeeded (what a deployment that stops at success pays per success)
    elapsed = torch.zeros(env.num_envs, dtype=torch.long)
    first_success = torch.zeros(env.num_envs, dtype=torch.long)
    steps_to_success: list[int] = []
    for _ in range(max_iters):
        if chunked is not None:
            action = chunked.act(obs, deterministic=deterministic)
        else:
            action = policy.act(obs, deterministic=deterministic)
        obs, _, terminated, truncated, info = env.step(action)
        if chunked is not None:
            chunked.episode_done(terminated | truncated)
        elapsed += 1
        if "success" in info:
            hit = info["success"].cpu().bool() & (first_success == 0)
            first_success[hit] = elapsed[hit]
        if "episode" in info:
            ep = info["episode"]
            ids = ep["env_ids"].cpu()
            steps_to_success += [int(first_success[i]) if ok else 0 for i, ok in zip(ids.tolist(), ep["success"].bool().tolist(),
                                                                                      strict=True)]
            elapsed[ids], first_success[ids] = 0, 0
            returns += ep["return"].tolist()
            lengths += ep["length"].tolist()
            success += ep["success"].bool().tolist()
            if "family" in ep and family_names is not None:  # multi-task suites (tasks/so101_suite.py)
                families += [family_names[int(f)] for f in ep["family"].tolist()]
            if "instruction" in ep:
                instructions += list(ep["instruction"])
        if len(returns) >= episodes:
            break
    returns, lengths, success = returns[:episodes], lengths[:episodes], success[:episodes]
    result: dict[str, Any] = {
        "episodes": len(returns),
        "success_rate": float(np.mean(success)) if success else 0.0,
        "return_mean": float(np.mean(returns)) if returns else 0.0,
        "return_std": float(np.std(returns)) if returns else 0.0,
        "length_mean": float(np.mean(lengths)) if lengths else 0.0,
    }
    hits = [n for n, ok in zip(steps_to_success[:episodes], success, strict=False) if ok and n > 0]
    if hits:  # successful episodes only; 0 when success was first seen on no step (a task without info["success"])
        result["steps_to_success_mean"] = float(np.mean(hits))
    if families:
        result["per_family"] = success_table(families[:episodes], success)
    if instructions:
        result["per_instruction"] = success_table(instructions[:episodes], success)
    if recorder is not None:
        result["video"] = str(recorder.save(video_path))
    return result


def success_table(labels: list[str], success: list[bool]) -> dict[str, dict[str, float]]:
    """Episodes and success rate per label (a task family or an instruction), labels sorted."""
    table: dict[str, dict[str, float]] = {}
    for label in sorted(set(labels)):
        hits = [s for lab, s in zip(labels, success, strict=True) if lab == label]
        table[label] = {"episodes": len(hits), "success_rate": float(np.mean(hits))}
    return table


class ChunkedActor:
    """Per-env queues of planned actions for a chunk policy, all planned in one batched call when any env needs one."""

    def __init__(self, policy, num_envs: int, execute_steps: int | None = None):
        self.policy = policy
        self.execute_steps = execute_steps or getattr(policy, "execute_steps", None) or policy.chunk_size
        self.plan: torch.Tensor | None = None
        self.position = torch.full((num_envs,), self.execute_steps, dtype=torch.long)

    @torch.no_grad()
    def act(self, obs: dict[str, torch.Tensor], deterministic: bool = True) -> torch.Tensor:
        need = self.position >= self.execute_steps
        if bool(need.any()):
            chunk = self.policy.sample_actions(obs, deterministic=deterministic)
            self.position = self.position.to(chunk.device)
            need = need.to(chunk.device)
            self.plan = chunk if self.plan is None else torch.where(need[:, None, None], chunk, self.plan)
            self.position[need] = 0
        rows = torch.arange(len(self.position), device=self.position.device)
        action = self.plan[rows, self.position]
        self.position += 1
        return action.clamp(-1.0, 1.0)

    def episode_done(self, done: torch.Tensor) -> None:
        self.position[done.to(self.position.device)] = self.execute_steps
