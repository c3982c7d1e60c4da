"""Deterministic evaluation: success rate, mean return, and a video of env 0."""

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
    max_iters = episodes * env.max_episode_steps + env.max_episode_steps  # bounded even if envs never finish
    for _ in range(max_iters):
        action = policy.act(obs, deterministic=deterministic)
        obs, _, _, _, info = env.step(action)
        if "episode" in info:
            ep = info["episode"]
            returns += ep["return"].tolist()
            lengths += ep["length"].tolist()
            success += ep["success"].bool().tolist()
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
    if recorder is not None:
        result["video"] = str(recorder.save(video_path))
    return result
