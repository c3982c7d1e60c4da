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

from rlrobot.domains import NonNegative, PositiveInt, UnitInterval
from rlrobot.sections import Section

RewardFactory = Callable[[Any], Any]  # VecEnv -> wrapped VecEnv
_SHAPINGS: dict[str, Callable[..., RewardFactory]] = {}
_TAKES_CONFIG: set[str] = set()
PRM_PREFIX = "prm:"
PRM_MODES = ("potential", "raw", "progress")  # --reward.prm-mode (rlrobot.rewards.prm_reward)


def register_reward(name: str, make_factory: Callable[..., RewardFactory], takes_config: bool = False) -> None:
    """``make_factory(gamma=...)`` returns the factory that wraps an env; with ``takes_config`` it is called as
    ``make_factory(gamma=..., config=RewardConfig, argument=...)`` (``argument``: what follows ``name:`` in
    ``--reward.shaping``, e.g. the path of ``prm:PATH``)."""
    _SHAPINGS[name] = make_factory
    if takes_config:
        _TAKES_CONFIG.add(name)


class ChunkDiscount:
    """The per-step discount of a potential-based term, for the learner's discounting. A per-step learner (PPO, SAC)
    discounts every env step by gamma. An action-chunk learner (flow-policy PPO) sums a chunk's step rewards and
    discounts once per chunk, so a chunk's potential terms must add up to gamma Phi(chunk end) - Phi(chunk start): gamma
    on the chunk's last step, 1 on the others. (Gamma on every step would leave -(1 - gamma) x the Phi of the chunk's
    inner states in each chunk's reward: a penalty for progress, not potential-based.) The chunk runner calls
    ``set_steps_per_discount(env, execute_steps)`` at an iteration boundary; all envs step in lockstep."""

    gamma: float
    steps_per_discount: int = 1
    _phase: int = 0

    def set_steps_per_discount(self, steps: int) -> None:
        if steps < 1:
            raise ValueError(f"steps_per_discount must be >= 1, got {steps}")
        self.steps_per_discount, self._phase = int(steps), 0

    def step_gamma(self) -> float:
        """The discount of this step's potential term (advances the phase)."""
        self._phase = (self._phase + 1) % self.steps_per_discount
        return self.gamma if self._phase == 0 else 1.0


def set_steps_per_discount(env: Any, steps: int) -> int:
    """Tell every potential-based reward wrapper in ``env``'s wrapper chain that the learner discounts once per
    ``steps`` env steps (an action chunk). Returns how many wrappers were set."""
    found = 0
    for _ in range(16):  # the chain is short: JSRL's guide, reward wrappers, the task
        if isinstance(env, ChunkDiscount):
            env.set_steps_per_discount(steps)
            found += 1
        env = env.__dict__.get("env") if hasattr(env, "__dict__") else None
        if env is None:
            break
    return found


def reward_names() -> tuple[str, ...]:
    from . import prm_reward, shaping, srpo  # noqa: F401  (register the built-in kinds)

    return ("none", *_SHAPINGS)


def _kind(shaping: str) -> tuple[str, str]:
    """``prm:PATH`` -> ("prm", "PATH"); other names have no argument."""
    if shaping.startswith(PRM_PREFIX):
        return "prm", shaping[len(PRM_PREFIX):]
    return shaping, ""


@dataclass
class RewardConfig(Section):
    shaping: str = "none"
    """reward wrapper of the training env: none | dense-potential (potential-based shaping gamma Phi(s') - Phi(s)
    with the task's dense reward as Phi) | prm:PATH (a process reward model's progress, rlrobot train --algo prm) |
    srpo (SRPO latent progress: a trajectory reward at each episode's end against recent successes of its
    instruction); all add to the task's reward: use with --reward-mode sparse"""
    gamma: UnitInterval | None = None
    """discount of the potential-based terms (None = the algorithm's, which keeps the optimal policy unchanged)"""
    prm_mode: Literal["potential", "raw", "progress"] = "potential"
    """(prm) potential: gamma Phi(s') - Phi(s) with Phi(s_t) = progress of s_t from the episode's first frame | raw: the
    per-step progress delta (s_t -> s_t+1) | progress: Phi(s_t+1) itself, a level reward (not potential-based)"""
    prm_scale: NonNegative = 1.0
    """(prm) weight of the progress term"""
    prm_done: bool = False
    """(prm) end an episode (terminated) when the model's done probability exceeds its threshold"""
    srpo_scale: NonNegative = 1.0
    """(srpo) weight of the trajectory reward (1 for a success, < 0.6 for a failure)"""
    srpo_memory: PositiveInt = 64
    """(srpo) recent successes (and failure distances) kept per instruction as the reference"""

    def env_wrappers(self, run) -> list[RewardFactory]:
        """The reward wrappers of the training env (the evaluation env keeps the task's own reward)."""
        return self.wrappers(run.algorithm.discount, algo=run.algo)

    def validate(self, run) -> None:
        kind, argument = _kind(self.shaping)
        if kind not in reward_names():
            shown = tuple("prm:PATH" if n == "prm" else n for n in reward_names())
            raise ValueError(f"reward.shaping={self.shaping!r} is not one of {shown}")
        if self.prm_mode not in PRM_MODES:
            raise ValueError(f"reward.prm_mode={self.prm_mode!r} is not one of {PRM_MODES}")
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
