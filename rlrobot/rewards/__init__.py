"""Reward wrappers: the one slot through which shaping and learned (process) reward models reach training.

A reward wrapper is a VecEnv that wraps another, replaces or adds to its reward, and keeps ``info["final_obs"]``,
``info["episode"]`` (its ``return`` becomes the wrapped return; ``task_return`` keeps the task's) and
``info["success"]`` consistent. ``rlrobot.make(..., reward_wrappers=[...])`` applies factories (env -> wrapped env)
in order; ``RewardConfig`` (``--reward.*``) builds them for a run. New kinds register with ``register_reward``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

RewardFactory = Callable[[Any], Any]  # VecEnv -> wrapped VecEnv
_SHAPINGS: dict[str, Callable[..., RewardFactory]] = {}


def register_reward(name: str, make_factory: Callable[..., RewardFactory]) -> None:
    """``make_factory(gamma=...)`` returns the factory that wraps an env."""
    _SHAPINGS[name] = make_factory


def reward_names() -> tuple[str, ...]:
    from . import shaping  # noqa: F401  (registers the built-in kinds)

    return ("none", *_SHAPINGS)


@dataclass
class RewardConfig:
    shaping: str = "none"
    """reward wrapper of the training env: none | dense-potential (potential-based shaping gamma Phi(s') - Phi(s)
    with the task's dense reward as Phi; use with --reward-mode sparse)"""
    gamma: float | None = None
    """discount of the shaping term (None = the algorithm's, which keeps the optimal policy unchanged)"""

    def validate(self, run) -> None:
        if self.shaping not in reward_names():
            raise ValueError(f"reward.shaping={self.shaping!r} is not one of {reward_names()}")
        if self.shaping == "none":
            return
        if ":" in run.task:
            raise ValueError(f"reward.shaping={self.shaping!r} needs a native task (its dense reward is the potential); "
                             f"task={run.task!r} is an adapter")
        if self.gamma is None and run.algorithm.discount is None:
            raise ValueError(f"reward.shaping={self.shaping!r}: algo={run.algo!r} learns without rewards")
        if self.gamma is not None and not 0.0 < self.gamma <= 1.0:
            raise ValueError(f"reward.gamma must be in (0, 1], got {self.gamma}")

    def wrappers(self, discount: float | None, algo: str = "") -> list[RewardFactory]:
        if self.shaping == "none":
            return []
        reward_names()
        return [_SHAPINGS[self.shaping](gamma=self.gamma if self.gamma is not None else discount)]
