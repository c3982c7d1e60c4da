"""Evaluation over a fixed set of episodes: success rate, mean return, and a video of env 0.

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
from rlrobot.policies.chunking import ChunkedActor


class EpisodeSlots:
    """Which finished episodes an evaluation counts: the first ``episodes`` in round-robin order over the envs (env i's
    j-th episode fills slot j * num_envs + i), fixed before any episode runs. "The first episodes to finish" would
    over-represent short ones wherever failures end early (falls, a lost cube): each env here runs its own quota of
    whole episodes, floor or ceil of episodes / num_envs, however fast they end."""

    def __init__(self, episodes: int, num_envs: int):
        if episodes < 1 or num_envs < 1:
            raise ValueError(f"episodes and num_envs must be >= 1, got {episodes} and {num_envs}")
        self.episodes, self.num_envs = episodes, num_envs
        self.finished = torch.zeros(num_envs, dtype=torch.long)
        self.filled = 0

    def assign(self, env_ids: torch.Tensor) -> torch.Tensor:
        """Slot of each episode that just ended in ``env_ids`` (distinct envs), -1 where it does not count."""
        env_ids = env_ids.cpu().long()
        slots = self.finished[env_ids] * self.num_envs + env_ids
        self.finished[env_ids] += 1
        slots = torch.where(slots < self.episodes, slots, torch.full_like(slots, -1))
        self.filled += int((slots >= 0).sum())
        return slots

    @property
    def complete(self) -> bool:
        return self.filled >= self.episodes

    @property
    def max_rounds(self) -> int:
        """Episodes the busiest env runs."""
        return -(-self.episodes // self.num_envs)


@torch.inference_mode()
def evaluate(policy, env: VecEnv, episodes: int, seed: int = 10_000, video_path: Path | None = None,
             video_episodes: int = 2, deterministic: bool = True) -> dict[str, Any]:
    """Success rate, returns and lengths over a fixed set of ``episodes`` episodes (``EpisodeSlots``: each env runs its
    quota of whole episodes), from ``env.reset(seed=seed)``. Random draws of the policy (a stochastic evaluation, or
    a policy that samples noise to act) come from torch's RNG seeded with ``seed`` inside a fork, so an evaluation is
    reproducible and leaves the training's random streams untouched."""
    recorder = VideoRecorder(env, 0, video_episodes) if video_path is not None and hasattr(env, "render") else None
    if recorder is not None:
        env = recorder
    slots = EpisodeSlots(episodes, env.num_envs)
    returns = np.zeros(episodes)
    lengths = np.zeros(episodes, dtype=np.int64)
    success = np.zeros(episodes, dtype=bool)
    steps_to_success = np.zeros(episodes, dtype=np.int64)
    have = np.zeros(episodes, dtype=bool)
    families: list[str | None] = [None] * episodes
    instructions: list[str | None] = [None] * episodes
    family_names = getattr(env, "family_names", None)
    max_iters = (slots.max_rounds + 1) * env.max_episode_steps  # bounded even if envs never finish
    chunked = ChunkedActor(policy, env.num_envs) if hasattr(policy, "sample_actions") else None
    # physical steps until each episode first succeeded (what a deployment that stops at success pays per success)
    elapsed = torch.zeros(env.num_envs, dtype=torch.long)
    first_success = torch.zeros(env.num_envs, dtype=torch.long)
    with torch.random.fork_rng(devices=_accelerators(env)):
        torch.manual_seed(seed)
        obs, _ = env.reset(seed=seed)
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
                ids = ep["env_ids"].cpu().long()
                slot = slots.assign(ids)
                counted = slot >= 0
                where, rows = slot[counted].numpy(), counted.numpy()
                have[where] = True
                ok = ep["success"].cpu().bool()
                returns[where] = ep["return"].cpu().double().numpy()[rows]
                lengths[where] = ep["length"].cpu().numpy()[rows]
                success[where] = ok.numpy()[rows]
                steps_to_success[where] = torch.where(ok, first_success[ids], 0).numpy()[rows]
                for row, s in zip(np.flatnonzero(rows).tolist(), where.tolist(), strict=True):
                    if "family" in ep and family_names is not None:  # multi-task suites (tasks/so101_suite.py)
                        families[s] = family_names[int(ep["family"][row])]
                    if "instruction" in ep:
                        instructions[s] = ep["instruction"][row]
                elapsed[ids], first_success[ids] = 0, 0
            if slots.complete:
                break
    filled = np.flatnonzero(have)  # all slots, unless the step bound ran out before every env finished its quota
    n = len(filled)
    returns, lengths, success, steps_to_success = returns[filled], lengths[filled], success[filled], steps_to_success[filled]
    result: dict[str, Any] = {
        "episodes": n,
        "success_rate": float(np.mean(success)) if n else 0.0,
        "return_mean": float(np.mean(returns)) if n else 0.0,
        "return_std": float(np.std(returns)) if n else 0.0,
        "length_mean": float(np.mean(lengths)) if n else 0.0,
    }
    hits = steps_to_success[success & (steps_to_success > 0)]
    if len(hits):  # successful episodes only; 0 when success was first seen on no step (a task without info["success"])
        result["steps_to_success_mean"] = float(np.mean(hits))
    labels = {"per_family": [families[i] for i in filled], "per_instruction": [instructions[i] for i in filled]}
    for key, values in labels.items():
        if values and all(v is not None for v in values):
            result[key] = success_table(values, success.tolist())  # type: ignore[arg-type]
    if recorder is not None:
        result["video"] = str(recorder.save(video_path))
    return result


def _accelerators(env: VecEnv) -> list[int]:
    device = torch.device(getattr(env, "device", "cpu"))
    return [device.index or 0] if device.type == "cuda" else []


def success_table(labels: list[str], success: list[bool]) -> dict[str, dict[str, float]]:
    """Episodes and success rate per label (a task family or an instruction), labels sorted."""
    table: dict[str, dict[str, float]] = {}
    for label in sorted(set(labels)):
        hits = [s for lab, s in zip(labels, success, strict=True) if lab == label]
        table[label] = {"episodes": len(hits), "success_rate": float(np.mean(hits))}
    return table
