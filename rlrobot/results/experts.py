"""Scripted-expert figures: success and object-lost rates of seeded expert episodes (``rlrobot results experts``), per
family on the language suite.

The same measurement as ``tests/tasks/test_so101_experts.py`` (32 envs, env and episode seed ``seed``, the first
``episodes`` finished episodes), plus the rate of episodes that ended terminated: a cube knocked or flung off the
table, or a diverged simulation. ``noise`` adds Gaussian noise to the expert's normalised actions (the flung-cube
check of the contact fix used noisy experts).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

import rlrobot
from rlrobot.runners.evaluation import EpisodeSlots
from rlrobot.tasks.registry import task_spec


@dataclass
class ExpertsArgs:
    tasks: tuple[str, ...] = ("so101-reach", "so101-push", "so101-lift")
    """native tasks with a scripted expert (and the contact-study variants, e.g. so101-push-contacts-0.005)"""
    episodes: int = 64
    seed: int = 0
    noise: float = 0.0
    """std of Gaussian noise on the expert's normalised actions"""
    num_envs: int = 32
    control_mode: str = "ee_delta"
    json_out: str | None = None


def expert_rates(task: str, episodes: int, seed: int = 0, noise: float = 0.0, num_envs: int = 32,
                 control_mode: str = "ee_delta") -> dict[str, float]:
    """{'success', 'lost', 'episodes'} over a fixed set of ``episodes`` episodes (each env its quota of whole episodes:
    ``rlrobot.runners.evaluation.EpisodeSlots``; a lost cube ends an episode early, so the first episodes to finish
    would over-count it); on a multi-family task (the language suite) also ``families``: {family: the same three}."""

    if episodes < 1 or num_envs < 1:
        raise ValueError(f"episodes and num_envs must be >= 1, got {episodes} and {num_envs}")
    if noise < 0:
        raise ValueError(f"noise must be >= 0, got {noise}")
    env = rlrobot.make(task, num_envs, seed=seed, control_mode=control_mode)
    gen = torch.Generator().manual_seed(seed)
    slots = EpisodeSlots(episodes, num_envs)
    success = np.zeros(episodes, dtype=bool)
    lost = np.zeros(episodes, dtype=bool)
    family = np.full(episodes, -1, dtype=np.int64)
    family_names = getattr(env, "family_names", None)
    try:
        env.reset(seed=seed)
        while not slots.complete:
            action = env.expert_action()
            if noise > 0:
                action = (action + noise * torch.randn(action.shape, generator=gen)).clamp(-1.0, 1.0)
            _, _, terminated, _, info = env.step(action)
            if "episode" in info:
                ids = info["episode"]["env_ids"].cpu().long()
                slot = slots.assign(ids)
                counted = slot >= 0
                success[slot[counted].numpy()] = info["episode"]["success"].cpu().bool()[counted].numpy()
                lost[slot[counted].numpy()] = terminated.cpu()[ids][counted].numpy()
                if "family" in info["episode"]:
                    family[slot[counted].numpy()] = info["episode"]["family"].cpu().long()[counted].numpy()
    finally:
        env.close()
    rates: dict[str, Any] = {"success": float(np.mean(success)), "lost": float(np.mean(lost)), "episodes": float(episodes)}
    if family_names is not None and (family >= 0).any():
        rates["families"] = {name: {"success": float(np.mean(success[family == i])), "lost": float(np.mean(lost[family == i])),
                                    "episodes": float((family == i).sum())}
                             for i, name in enumerate(family_names) if (family == i).any()}
    return rates


def run_experts(args: ExpertsArgs) -> dict[str, Any]:
    for task in args.tasks:  # every task id checked before any compute
        if not task_spec(task).has_expert:
            raise ValueError(f"tasks: {task!r} has no scripted expert")
    result = {task: expert_rates(task, args.episodes, args.seed, args.noise, args.num_envs, args.control_mode)
              for task in args.tasks}
    for task, r in result.items():
        print(f"{task}: expert success {r['success']:.3f}, object lost {r['lost']:.3f} over {args.episodes} episodes "
              f"(seed {args.seed}, noise {args.noise})", flush=True)
        for name, f in r.get("families", {}).items():
            print(f"  {name}: success {f['success']:.3f}, object lost {f['lost']:.3f} over {f['episodes']:.0f} episodes",
                  flush=True)
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(result, indent=2))
    return result
