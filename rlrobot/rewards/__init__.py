"""Reward wrappers: the one slot through which shaping and learned (process) reward models reach training.

A reward wrapper is a VecEnv that wraps another, replaces or adds to its reward, and keeps ``info["final_obs"]``,
``info["episode"]`` (its ``return`` becomes the wrapped return; ``task_return`` keeps the task's) and
``info["success"]`` consistent. ``rlrobot.make(..., reward_wrappers=[...])`` applies factories (env -> wrapped env)
in order; ``RewardConfig`` (``--reward.*``) builds them for a run. New kinds register with ``register_reward``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

RewardFactory = Callable[[Any], Any]  # VecEnv -> wrapped VecEnv
_SHAPINGS: dict[str, Callable[..., RewardFactory]] = {}
_TAKES_CONFIG: set[str] = set()
PRM_PREFIX = "prm:"


def register_reward(name: str, make_factory: Callable[..., RewardFactory], takes_config: bool = False) -> None:
    """``make_factory(gamma=...)`` returns the factory that wraps an env; with ``takes_config`` it is called as
    ``make_factory(gamma=..., config=RewardConfig, argument=...)`` (``argument``: what follows ``name:`` in
    ``--reward.shaping``, e.g. the path of ``prm:PATH``)."""
    _SHAPINGS[name] = make_factory
    if takes_config:
        _TAKES_CONFIG.add(name)


def reward_names() -> tuple[str, ...]:
    from . import prm_reward, shaping, srpo  # noqa: F401  (register the built-in kinds)

    return ("none", *_SHAPINGS)


def _kind(shaping: str) -> tuple[str, str]:
    """``prm:PATH`` -> ("prm", "PATH"); other names have no argument."""
    if shaping.startswith(PRM_PREFIX):
        return "prm", shaping[len(PRM_PREFIX):]
    return shaping, ""


@dataclass
class RewardConfig:
    shaping: str = "none"
    """reward wrapper of the training env: none | dense-potential (potential-based shaping gamma Phi(s') - Phi(s)
    with the task's dense reward as Phi) | prm:PATH (a process reward model's progress, rlrobot train --algo prm) |
    srpo (SRPO latent progress: a trajectory reward at each episode's end against recent successes of its
    instruction); all add to the task's reward: use with --reward-mode sparse"""
    gamma: float | None = None
    """discount of the potential-based terms (None = the algorithm's, which keeps the optimal policy unchanged)"""
    prm_mode: Literal["potential", "raw"] = "potential"
    """(prm) potential: gamma Phi(s') - Phi(s) with Phi(s_t) = progress of s_t from the episode's first frame | raw: the
    per-step progress delta (s_t -> s_t+1)"""
    prm_scale: float = 1.0
    """(prm) weight of the progress term"""
    prm_done: bool = False
    """(prm) end an episode (terminated) when the model's done probability exceeds its threshold"""
    srpo_scale: float = 1.0
    """(srpo) weight of the trajectory reward (1 for a success, < 0.6 for a failure)"""
    srpo_memory: int = 64
    """(srpo) recent successes (and failure distances) kept per instruction as the reference"""

    def validate(self, run) -> None:
        kind, argument = _kind(self.shaping)
        if kind not in reward_names():
            shown = tuple("prm:PATH" if n == "prm" else n for n in reward_names())
            raise ValueError(f"reward.shaping={self.shaping!r} is not one of {shown}")
        if self.prm_mode not in ("potential", "raw"):
            raise ValueError(f"reward.prm_mode={self.prm_mode!r} is not one of ('potential', 'raw')")
        if self.prm_scale <= 0 or self.srpo_scale <= 0:
            raise ValueError(f"reward.prm_scale and reward.srpo_scale must be > 0, got {self.prm_scale} and {self.srpo_scale}")
        if self.srpo_memory < 1:
            raise ValueError(f"reward.srpo_memory must be >= 1, got {self.srpo_memory}")
        if kind == "none":
            return
        adapter = ":" in run.task
        if kind == "dense-potential" and adapter:
            raise ValueError(f"reward.shaping={self.shaping!r} needs a native task (its dense reward is the potential); "
                             f"task={run.task!r} is an adapter")
        if kind == "srpo" and adapter:
            raise ValueError(f"reward.shaping='srpo' needs a native task (instructions and success per episode); "
                             f"task={run.task!r} is an adapter")
        if kind == "srpo" and "state" not in run.obs_mode:
            raise ValueError(f"reward.shaping='srpo' embeds episodes by their state; obs_mode={run.obs_mode!r} has none")
        if kind == "prm":
            if not argument:  # the checkpoint itself is read (and refused if missing) when the env is wrapped
                raise ValueError("reward.shaping: prm:PATH needs a path to a PRM run or checkpoint (rlrobot train --algo prm)")
            if self.prm_done and adapter:
                raise ValueError(f"reward.prm_done ends single episodes, which needs a native task; task={run.task!r}")
        if self.gamma is None and run.algorithm.discount is None:
            raise ValueError(f"reward.shaping={self.shaping!r}: algo={run.algo!r} learns without rewards")
        if self.gamma is not None and not 0.0 < self.gamma <= 1.0:
            raise ValueError(f"reward.gamma must be in (0, 1], got {self.gamma}")

    def wrappers(self, discount: float | None, algo: str = "") -> list[RewardFactory]:
        kind, argument = _kind(self.shaping)
        if kind == "none":
            return []
        reward_names()
        gamma = self.gamma if self.gamma is not None else discount
        if kind in _TAKES_CONFIG:
            return [_SHAPINGS[kind](gamma=gamma, config=self, argument=argument)]
        return [_SHAPINGS[kind](gamma=gamma)]
