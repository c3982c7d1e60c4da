"""The config sections of a run. ``TrainConfig`` holds one section per concern (the algorithm's ``--sac.*``, the
policy kind's ``--policy.*`` / ``--flow.*``, the reward wrappers' ``--reward.*``, curricula such as ``--jsrl.*``) and
treats them alike: it validates and prepares every section it holds and asks each for the training-env wrappers it
adds, so no code has to know which sections a run has."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Section:
    """Base of every config section (a dataclass). ``run`` is the whole run config."""

    def validate(self, run: Any) -> None:
        """Raise ValueError naming the field and what is allowed; no I/O, no changes to the config."""
        return None

    def prepare(self, run: Any) -> None:
        """Read what the section names on disk (datasets, checkpoints to start from) before anything is built; may
        adopt settings from there. The only step that does I/O."""
        return None

    def observation_keys(self, run: Any) -> tuple[str, ...] | None:
        """A policy kind's section: the observation keys its networks read (None: not a policy, or not known yet)."""
        return None

    def env_wrappers(self, run: Any) -> list[Callable[[Any], Any]]:
        """Wrappers (env -> wrapped env) this section adds to the training env (never to the evaluation env)."""
        return []
