"""The discount of potential-based reward terms, for learners that discount once per action chunk."""

from __future__ import annotations

from typing import Any


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
