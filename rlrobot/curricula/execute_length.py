"""PolicyTrim's execute-length curriculum for chunk policies: execute more of each predicted chunk open-loop while
success holds, so the deployed policy is called less often.

PolicyTrim (VLA post-training for deployment efficiency) grows the executed part of each chunk by a curriculum up to
the reliable limit and rewards successful completion with longer open-loop execution. Here the curriculum is a rule
on the training episodes' success, applied between RL iterations of flow-policy RL (``--algo flow-nft --trim.curriculum``):

    stage s executes e_s actions of each chunk (e_0 = flow.execute_steps, e_{s+1} = min(e_s + step, chunk_size));
    after at least ``min_iterations`` iterations at the stage and ``window`` finished episodes since it began, advance
    when   mean success of the last ``window`` episodes  >=  best  -  tolerance,
    where ``best`` is the best such windowed mean seen at any stage so far (success must hold, not merely exist).

Longer open-loop execution is itself the efficiency reward's lever: an RL iteration at stage s optimises the success
of e_s-step open-loop execution, so the policy learns chunks that stay good for longer.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Annotated, Any

from rlrobot.domains import Domain, PositiveInt
from rlrobot.sections import Section


@dataclass
class PolicyTrimConfig(Section):
    curriculum: bool = False
    """grow flow.execute_steps while training success holds (PolicyTrim's execute-length curriculum)"""
    step: PositiveInt = 1
    """actions added to the executed part of each chunk per stage"""
    window: PositiveInt = 128
    """finished training episodes in the windowed success mean"""
    tolerance: Annotated[float, Domain(0.0, 1.0, high_open=True)] = 0.03
    """advance while the windowed success >= best windowed success - tolerance"""
    min_iterations: PositiveInt = 5
    """iterations at a stage before it may advance"""

    def validate(self, run=None) -> None:
        for name in ("step", "window", "min_iterations"):
            if getattr(self, name) < 1:
                raise ValueError(f"trim.{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.tolerance < 1:
            raise ValueError(f"trim.tolerance must be in [0, 1), got {self.tolerance}")


@dataclass
class PolicyTrimInput:
    trim: PolicyTrimConfig = field(default_factory=PolicyTrimConfig)
    """PolicyTrim's execute-length curriculum"""


class ExecuteCurriculum:
    """The stage rule above; ``record`` the success flags of finished episodes, call ``end_iteration`` once per RL
    iteration, which returns the new execute length when the stage advances (else None)."""

    def __init__(self, cfg: PolicyTrimConfig, execute_steps: int, chunk_size: int):
        self.cfg, self.execute_steps, self.chunk_size = cfg, execute_steps, chunk_size
        self.recent: deque[float] = deque(maxlen=cfg.window)
        self.best: float | None = None
        self.stage = 0
        self.stage_iterations = 0
        self.history: list[dict[str, float]] = []

    def record(self, successes) -> None:
        self.recent.extend(float(s) for s in successes)

    @property
    def windowed_success(self) -> float | None:
        return sum(self.recent) / len(self.recent) if len(self.recent) == self.cfg.window else None

    def end_iteration(self) -> int | None:
        self.stage_iterations += 1
        mean = self.windowed_success
        if mean is None:
            return None
        self.best = mean if self.best is None else max(self.best, mean)
        if (self.stage_iterations < self.cfg.min_iterations or self.execute_steps >= self.chunk_size
                or mean < self.best - self.cfg.tolerance):
            return None
        self.history.append({"stage": self.stage, "execute_steps": self.execute_steps, "success": mean,
                             "iterations": self.stage_iterations})
        self.execute_steps = min(self.execute_steps + self.cfg.step, self.chunk_size)
        self.stage += 1
        self.stage_iterations = 0
        self.recent.clear()  # the next stage is judged on its own episodes
        return self.execute_steps

    def state_dict(self) -> dict[str, Any]:
        return {"execute_steps": self.execute_steps, "recent": list(self.recent), "best": self.best, "stage": self.stage,
                "stage_iterations": self.stage_iterations, "history": self.history}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.execute_steps, self.best, self.stage = state["execute_steps"], state["best"], state["stage"]
        self.stage_iterations, self.history = state["stage_iterations"], list(state["history"])
        self.recent.clear()
        self.recent.extend(state["recent"])
