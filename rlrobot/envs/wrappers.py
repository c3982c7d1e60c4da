"""VecEnv wrappers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlrobot.logging.video import write_video


class VideoRecorder:
    """Records frames of one env (env 0 by default) for its first ``max_episodes`` episodes; ``save`` writes them.

    Works with any VecEnv that has ``render(env_index)``; everything else passes through unchanged.
    """

    def __init__(self, env, env_index: int = 0, max_episodes: int = 2):
        if not hasattr(env, "render"):
            raise ValueError(f"{type(env).__name__} has no render(env_index); it cannot be recorded")
        self.env = env
        self.env_index = env_index
        self.max_episodes = max_episodes
        self.frames: list[np.ndarray] = []
        self.episodes_done = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    def reset(self, seed: int | None = None):
        out = self.env.reset(seed=seed)
        self.frames, self.episodes_done = [self.env.render(self.env_index)], 0
        return out

    def step(self, action: torch.Tensor):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self.episodes_done < self.max_episodes:
            if "episode" in info:
                self.episodes_done += int((info["episode"]["env_ids"] == self.env_index).sum())
            self.frames.append(self.env.render(self.env_index))
        return obs, reward, terminated, truncated, info

    def save(self, path: Path) -> Path:
        fps = int(round(1.0 / getattr(self.env, "control_dt", 0.04)))
        return write_video(self.frames, path, fps=fps)
