"""``--reward.*``: the reward wrapper of the training env. ``RewardConfig`` holds what every kind shares (``shaping``:
which kind; ``gamma``) and one section per registered kind that has settings (``--reward.prm.scale``,
``--reward.srpo.memory``, ...), made from the reward-kind registry as ``rlrobot.config`` makes run configs from the
algorithm registry: a kind with settings brings its section, and no code here knows any kind."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Annotated, Any

import tyro

from rlrobot.domains import UnitInterval
from rlrobot.rewards.registry import NONE, REWARD_KINDS, RewardFactory, RewardSpec, split_shaping
from rlrobot.sections import Section
from rlrobot.tasks.registry import is_adapter_task


@dataclass
class RewardSelection(Section):
    """The fields every reward kind shares; ``RewardConfig`` adds the kinds' sections."""

    shaping: str = NONE
    """reward wrapper of the training env: none or a reward kind (``--help`` lists them); it adds to the task's
    reward: use with --reward-mode sparse"""
    gamma: UnitInterval | None = None
    """discount of the potential-based terms (None = the algorithm's, which keeps the optimal policy unchanged)"""

    def selected(self) -> tuple[RewardSpec | None, str]:
        """(the selected kind's spec, or None for none; its argument). An unknown kind is refused naming the kinds."""
        name, argument = split_shaping(self.shaping)
        if self.shaping == NONE:
            return None, ""
        if name not in REWARD_KINDS:
            shown = (NONE, *(spec.shown for spec in REWARD_KINDS.specs()))
            raise ValueError(f"reward.shaping={self.shaping!r} is not one of {shown}")
        return REWARD_KINDS.get(name), argument

    def settings(self, spec: RewardSpec) -> Any:
        """The kind's section of this config (None for a kind without settings)."""
        return getattr(self, spec.config_field) if spec.config_field else None

    def validate(self, run: Any) -> None:
        spec, argument = self.selected()
        if spec is None:
            return
        if spec.argument and not argument:
            raise ValueError(f"reward.shaping: {spec.shown} needs its {spec.argument} ({spec.summary})")
        if argument and not spec.argument:
            raise ValueError(f"reward.shaping={self.shaping!r}: {spec.name} takes no argument")
        if spec.native_task and is_adapter_task(run.task):
            raise ValueError(f"reward.shaping={self.shaping!r} needs a native task ({spec.native_task}); "
                             f"task={run.task!r} is an adapter")
        if spec.state_observation and "state" not in run.obs_mode:
            raise ValueError(f"reward.shaping={self.shaping!r} {spec.state_observation}; obs_mode={run.obs_mode!r} has "
                             "no state")
        if spec.config is not None:
            self.settings(spec).validate(run)
        if self.gamma is None and run.algorithm.discount is None:
            raise ValueError(f"reward.shaping={self.shaping!r}: algo={run.algo!r} learns without rewards")
        if self.gamma is not None and not 0.0 < self.gamma <= 1.0:
            raise ValueError(f"reward.gamma must be in (0, 1], got {self.gamma}")

    def env_wrappers(self, run: Any) -> list[RewardFactory]:
        """The reward wrappers of the training env (the evaluation env keeps the task's own reward)."""
        return self.wrappers(run.algorithm.discount)

    def wrappers(self, discount: float | None) -> list[RewardFactory]:
        """The selected kind's factory (env -> wrapped env), with ``discount`` as gamma unless ``gamma`` is set."""
        spec, argument = self.selected()
        if spec is None:
            return []
        gamma = self.gamma if self.gamma is not None else discount
        return [spec.make(gamma, self.settings(spec), argument)]


def _shaping_help() -> str:
    kinds = "; ".join(f"{spec.shown}: {spec.summary}" for spec in REWARD_KINDS.specs())
    return (f"reward wrapper of the training env: none | {' | '.join(s.shown for s in REWARD_KINDS.specs())} ({kinds}); "
            "all add to the task's reward: use with --reward-mode sparse")


def reward_config_class() -> type[RewardSelection]:
    """``RewardConfig``: the shared fields and a section per registered kind with settings (``--reward.<field>.*``)."""
    fields: list[tuple[str, Any, Any]] = [
        ("shaping", Annotated[str, tyro.conf.arg(help=_shaping_help())], dataclasses.field(default=NONE))]
    fields += [(spec.config_field, spec.config, dataclasses.field(default_factory=spec.config))
               for spec in REWARD_KINDS.specs() if spec.config is not None]
    cls = dataclasses.make_dataclass("RewardConfig", fields, bases=(RewardSelection,))
    cls.__module__ = __name__
    cls.__doc__ = "Reward wrapper of the training env: the kind (--reward.shaping), gamma and each kind's settings."
    return cls


RewardConfig = reward_config_class()  # a module attribute, so that pickle and copy find it by name
