"""Reward kinds: each kind is one module of ``rlrobot.rewards`` that registers a ``RewardSpec`` on import.

``--reward.shaping NAME`` selects a kind (``NAME:ARG`` for a kind that takes an argument, e.g. ``prm:PATH``) and
``--reward.<config_field>.*`` holds its settings (``RewardConfig`` has one section per kind that has settings). What a
kind needs from the run (a native task, the state observation) is data on its spec, so ``RewardConfig`` checks it
without knowing the kind.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlrobot.registry import Registry
from rlrobot.sections import Section

RewardFactory = Callable[[Any], Any]
"""env -> wrapped env (a VecEnv around a VecEnv)"""
NONE = "none"
"""``--reward.shaping none``: the task's own reward, no wrapper"""


@dataclass(frozen=True)
class RewardSpec:
    name: str
    """what ``--reward.shaping`` calls it"""
    summary: str
    """one line for the help of ``--reward.shaping``"""
    make: Callable[[float, Any, str], RewardFactory]
    """(gamma, settings, argument) -> the factory that wraps an env. gamma: the discount of potential-based terms
    (``--reward.gamma``, else the algorithm's); settings: the kind's section (None for a kind without one);
    argument: what follows ``NAME:`` in ``--reward.shaping`` ('' for a kind without one)"""
    config: type[Section] | None = None
    """the kind's settings (a Section: its own ``validate(run)``, called when the kind is selected)"""
    config_field: str | None = None
    """the settings' name in ``RewardConfig`` and on the CLI (``prm`` -> ``--reward.prm.scale``)"""
    argument: str = ""
    """what the kind takes after ``NAME:`` (e.g. ``PATH``); '' = no argument"""
    native_task: str = ""
    """why the kind needs a native task, e.g. "its dense reward is the potential" ('' = it runs on any task)"""
    state_observation: str = ""
    """what the kind reads the ``state`` observation for, e.g. "embeds episodes by their state" ('' = nothing)"""

    def __post_init__(self) -> None:
        if (self.config is None) != (self.config_field is None):
            raise ValueError(f"reward kind {self.name!r}: config and config_field go together")

    @property
    def shown(self) -> str:
        """The name as ``--reward.shaping`` takes it (``prm:PATH``)."""
        return f"{self.name}:{self.argument}" if self.argument else self.name


REWARD_KINDS: Registry[RewardSpec] = Registry("reward kind", lambda spec: spec.name)


def register_reward(kind: RewardSpec | str, make_factory: Callable[..., RewardFactory] | None = None) -> RewardSpec:
    """Register a reward kind: its ``RewardSpec``, or, for a kind without settings or argument, its name and
    ``make_factory(gamma=...)`` (returning the factory env -> wrapped env)."""
    if isinstance(kind, str):
        if make_factory is None:
            raise ValueError(f"register_reward({kind!r}): give make_factory(gamma=...) or a RewardSpec")
        kind = RewardSpec(kind, f"{kind} (registered by {getattr(make_factory, '__module__', '?')})",
                          lambda gamma, settings, argument: make_factory(gamma=gamma))
    return REWARD_KINDS.register(kind)


def reward_names() -> tuple[str, ...]:
    """What ``--reward.shaping`` accepts: none and every registered kind."""
    return (NONE, *REWARD_KINDS.names())


def split_shaping(shaping: str) -> tuple[str, str]:
    """``prm:PATH`` -> ("prm", "PATH"); a name without ``:`` has no argument."""
    name, _, argument = shaping.partition(":")
    return name, argument
