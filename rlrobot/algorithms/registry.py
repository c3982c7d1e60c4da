"""The algorithm registry: each algorithm module registers one ``AlgorithmSpec``; factories, validation, step counting
and the CLI look algorithms up here instead of testing their names.

An algorithm is one module that defines its config (an ``AlgorithmConfig``: its own validation and env steps per
iteration), its learner class (which owns its optimizers, storage and ``state_dict``), and calls ``register_algorithm``.
"""

from __future__ import annotations

import abc
import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from rlrobot.registry import Registry
from rlrobot.sections import Section

if TYPE_CHECKING:
    from rlrobot.config import TrainConfig


class AlgorithmConfig(Section, abc.ABC):
    """Base of every algorithm's config section (a dataclass). ``run`` is the whole run config (common fields, the
    policy section, this section)."""

    budget_field: ClassVar[str | None] = None
    """the field of this section that sets a run's length when the algorithm does not step the env (e.g.
    ``gradient_steps``); None: the run's ``--total-steps`` (env steps)"""

    @abc.abstractmethod
    def validate(self, run: TrainConfig) -> None:
        """Raise ValueError naming the field and what is allowed; no I/O, no changes to the config."""

    @abc.abstractmethod
    def env_steps_per_iteration(self, run: TrainConfig) -> int:
        """Environment steps of one runner iteration on one rank, summed over envs (0 when the env is not stepped)."""

    @property
    def discount(self) -> float | None:
        """The discount the learner uses (for potential-based reward shaping); None if it learns without rewards."""
        return getattr(self, "gamma", None)


@dataclass(frozen=True)
class AlgorithmSpec:
    """What an algorithm is, needs and offers: everything the config, the runners and the CLI ask of it."""

    name: str
    """what --algo takes"""
    summary: str
    """one line for help texts"""
    config_field: str
    """name of the config section in the run config (and the CLI prefix: ``sac`` -> ``--sac.utd``)"""
    config: type[AlgorithmConfig]
    policy_kind: str
    """the registered policy kind this algorithm trains (rlrobot.policies.registry)"""
    runner: str
    """``module:Class`` of its runner, imported only when a run starts"""
    run_fields: tuple[type, ...] = ()
    """extra top-level option groups the algorithm needs (``DatasetInput`` -> ``--dataset``, ``InitCheckpoint``,
    ``JSRLInput`` -> ``--jsrl.*`` for the learners a guide can roll in for)"""
    learner: type | None = None
    """the learner class its runner builds, where one runner serves several algorithms (the offline family)"""
    needs_rewards: bool = True
    """trains on rewards (False: behaviour cloning, which learns from a dataset without them)"""
    sac_compatible: bool = False
    """its actor, critics and normaliser are SAC's networks, so a warm start (``--init``) can continue from it"""
    flow_variant: str = ""
    """flow-policy PPO: how the denoising chain is made stochastic (``noise`` | ``sde``)"""

    def budget_flag(self) -> str:
        """The flag that sets a run's length: ``--total-steps``, or the section's own (``--iql.gradient-steps``)."""
        field = self.config.budget_field
        return "--total-steps" if field is None else f"--{self.config_field}.{field}".replace("_", "-")

    def runner_class(self) -> type:
        module, _, name = self.runner.partition(":")
        return getattr(importlib.import_module(module), name)


def _load_builtin() -> None:
    import rlrobot.algorithms  # noqa: F401  (its modules register themselves on import)


ALGORITHMS: Registry[AlgorithmSpec] = Registry("algorithm", lambda spec: spec.name, _load_builtin)


def register_algorithm(spec: AlgorithmSpec) -> AlgorithmSpec:
    return ALGORITHMS.register(spec)


def algorithm_names() -> tuple[str, ...]:
    return ALGORITHMS.names()


def algorithm_spec(name: str) -> AlgorithmSpec:
    """The spec registered under ``name``; an unknown name is refused with the registered ones."""
    return ALGORITHMS.get(name, field="algo")


def describe_algorithms() -> list[dict[str, Any]]:
    return [{"algo": s.name, "policy_kind": s.policy_kind, "summary": s.summary} for s in ALGORITHMS.specs()]
