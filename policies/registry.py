"""The policy registry: each policy kind registers how it is built from a checkpoint's metadata and the run config,
so that runners, ``eval``, ``serve`` and VLA adapters (``policies/vla/``) share one ``build_policy``.

A checkpoint's ``config.json`` holds the run config plus ``policy_metadata``: the policy kind and the spaces it was
trained on; ``check_compatible`` refuses to drive an env with other spaces.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

import rlrobot
from rlrobot.checkpoints import load_checkpoint, load_section, saved_train
from rlrobot.tasks.registry import is_adapter_task

if TYPE_CHECKING:
    from rlrobot.config import TrainConfig


@dataclass(frozen=True)
class PolicySpec:
    kind: str
    config_field: str
    """the policy's config section in the run config and CLI (``policy`` -> ``--policy.actor-hidden``)"""
    config: type
    build: Callable[[dict[str, Any], Any], torch.nn.Module]
    """(checkpoint metadata, policy config) -> the policy, weights not loaded"""
    legacy_class: str = ""
    """``policy_class`` that checkpoints written before the registry used for this kind"""


_POLICIES: dict[str, PolicySpec] = {}


def register_policy(spec: PolicySpec) -> PolicySpec:
    if spec.kind in _POLICIES and _POLICIES[spec.kind] != spec:
        raise ValueError(f"policy kind {spec.kind!r} is registered twice")
    _POLICIES[spec.kind] = spec
    return spec


def _load_builtin() -> None:
    import rlrobot.policies  # noqa: F401  (its modules register themselves on import)
    import rlrobot.policies.vla  # noqa: F401  (the 'vla' kind; imports without lerobot)


def policy_kinds() -> tuple[str, ...]:
    _load_builtin()
    return tuple(sorted(_POLICIES))


def policy_spec(kind: str) -> PolicySpec:
    _load_builtin()
    if kind not in _POLICIES:
        raise ValueError(f"policy kind {kind!r} is not registered; registered: {', '.join(sorted(_POLICIES))}")
    return _POLICIES[kind]


def policy_kind_of(meta: dict[str, Any]) -> str:
    """The policy kind of a checkpoint's metadata (``policy_class`` of checkpoints from before the registry)."""
    if "policy_kind" in meta:
        return meta["policy_kind"]
    legacy = meta.get("policy_class", "ActorCritic")
    _load_builtin()
    for spec in _POLICIES.values():
        if spec.legacy_class == legacy:
            return spec.kind
    raise ValueError(f"checkpoint policy_class={legacy!r} is not one of the classes this version can load: "
                     f"{sorted(s.legacy_class for s in _POLICIES.values() if s.legacy_class)}")


def policy_metadata(run: TrainConfig, env) -> dict[str, Any]:
    """What a checkpoint records about its policy and the env it was trained on."""
    space = env.single_observation_space
    return {
        "policy_kind": run.spec.policy_kind,
        "task": run.task,
        "obs_dim": int(space["state"].shape[0]) if "state" in space.spaces else None,
        "action_dim": int(env.single_action_space.shape[0]),
        "observation_space": {k: list(v.shape) for k, v in space.spaces.items()},
        "action_space": list(env.single_action_space.shape),
        "control_mode": run.control_mode if not is_adapter_task(run.task) else None,
        "control_dt": float(getattr(env, "control_dt", 0.0)),
        "rlrobot_version": rlrobot.__version__,
    }


def build_policy(meta: dict[str, Any], run: TrainConfig) -> torch.nn.Module:
    """The policy a checkpoint's metadata describes, built from the run's policy config (weights loaded by the caller)."""
    spec = policy_spec(policy_kind_of(meta))
    return spec.build(meta, getattr(run, spec.config_field))


def policy_from_checkpoint(path: str, device: str | torch.device = "cpu") -> tuple[torch.nn.Module, dict[str, Any], Any]:
    """(the policy of a checkpoint or run directory, built from its own saved policy section, weights loaded; its
    config.json contents; the checkpoint directory)."""
    weights, saved, ckpt = load_checkpoint(path)
    spec = policy_spec(policy_kind_of(saved))
    section = load_section(saved, spec.config_field, spec.config) if spec.config_field in saved_train(saved) \
        else spec.config()
    policy = spec.build(saved, section)
    policy.load_state_dict(weights)
    return policy.to(device), saved, ckpt


def check_compatible(saved: dict[str, Any], current: dict[str, Any]) -> None:
    """A checkpoint drives an env only if it was trained on the same spaces and control mode."""
    problems = []
    for key in ("obs_dim", "action_dim", "control_mode"):
        if saved.get(key) != current.get(key):
            problems.append(f"{key}: checkpoint {saved.get(key)!r} vs env {current.get(key)!r}")
    if problems:
        raise ValueError(f"checkpoint trained on task {saved.get('task')!r} does not match task {current.get('task')!r}: "
                         + "; ".join(problems))
