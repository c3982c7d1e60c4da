"""``rlrobot.make``: one factory for native tasks and simulator adapters (task ids as in DESIGN.md)."""

from __future__ import annotations

from typing import Any

import torch

from .vec_env import VecEnv

BACKENDS = ("mujoco", "mjwarp", "gymnasium", "maniskill", "isaaclab")
NATIVE_BACKENDS = ("mujoco", "mjwarp")  # the native MJCF tasks run on either: same task code, different physics
ADAPTER_PREFIXES = {"gym": "gymnasium", "maniskill": "maniskill", "isaaclab": "isaaclab"}


def native_task_ids() -> list[str]:
    from rlrobot.tasks.so101 import TASKS

    return sorted(TASKS)


def validate_task_id(task_id: str) -> None:
    """Raise before any compute if ``task_id`` names no task."""
    prefix, sep, name = task_id.partition(":")
    if sep:
        if prefix not in ADAPTER_PREFIXES:
            raise ValueError(f"task={task_id!r}: unknown prefix {prefix!r}; valid prefixes: {sorted(ADAPTER_PREFIXES)}")
        if prefix == "gym":
            import gymnasium

            if name not in gymnasium.registry:
                raise ValueError(f"task={task_id!r}: gymnasium has no env id {name!r}")
        elif prefix == "maniskill":
            from rlrobot.tasks.maniskill_adapter import registered_ids

            if name not in registered_ids():  # ImportError with the install line when ManiSkill is missing
                raise ValueError(f"task={task_id!r}: ManiSkill has no env id {name!r}")
        elif prefix == "isaaclab":
            from rlrobot.tasks.isaaclab_adapter import require_isaaclab

            require_isaaclab()  # ImportError naming what to install
            import gymnasium

            if name not in gymnasium.registry:
                raise ValueError(f"task={task_id!r}: Isaac Lab registers no task {name!r}")
        return
    if task_id not in native_task_ids():
        raise ValueError(
            f"task={task_id!r} is not a known task; valid tasks: {native_task_ids()} or a prefixed id such as "
            "'gym:Pendulum-v1'"
        )


def resolve_backend(task_id: str, backend: str | None) -> str:
    """The backend a task runs on (its own by default); a clear error for an unknown or incompatible one, and for
    an optional backend whose package is missing, before anything is built."""
    prefix, sep, _ = task_id.partition(":")
    expected = ADAPTER_PREFIXES[prefix] if sep else "mujoco"
    backend = backend or expected
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not one of {BACKENDS}")
    allowed = NATIVE_BACKENDS if expected == "mujoco" else (expected,)
    if backend not in allowed:
        raise ValueError(f"task={task_id!r} runs on backend {' or '.join(map(repr, allowed))}, not {backend!r}")
    if backend == "mjwarp":
        from rlrobot.tasks.mjwarp_backend import require_mujoco_warp

        require_mujoco_warp()
    return backend


def make(
    task_id: str,
    num_envs: int = 1,
    *,
    backend: str | None = None,
    device: str | torch.device | None = None,
    seed: int | None = None,
    **task_options: Any,
) -> VecEnv:
    """Build a batched env. Native tasks by name (``so101-reach``), other simulators by prefix (``gym:...``)."""
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    validate_task_id(task_id)
    backend = resolve_backend(task_id, backend)
    name = task_id.partition(":")[2]
    device = torch.device(device or "cpu")
    if backend == "gymnasium":
        from rlrobot.tasks.gymnasium_adapter import GymnasiumVecEnv

        return GymnasiumVecEnv(name, num_envs, device=device, seed=seed, **task_options)
    if backend == "maniskill":
        from rlrobot.tasks.maniskill_adapter import ManiSkillVecEnv

        return ManiSkillVecEnv(name, num_envs, device=device, seed=seed, **task_options)
    if backend == "isaaclab":
        from rlrobot.tasks.isaaclab_adapter import IsaacLabVecEnv

        return IsaacLabVecEnv(name, num_envs, device=device, seed=seed, **task_options)
    from rlrobot.tasks.so101 import TASKS

    task_cls = TASKS[task_id]
    if backend == "mjwarp":
        from rlrobot.tasks.mjwarp_backend import mjwarp_task_class

        task_cls = mjwarp_task_class(task_cls)
    return task_cls(num_envs, device=device, seed=seed, **task_options)


def describe_task(task_id: str) -> dict[str, Any]:
    """Spaces and options of a task, for ``rlrobot list-tasks``."""
    env = make(task_id, 1)
    try:
        return {
            "task": task_id,
            "observation": {k: tuple(v.shape) for k, v in env.single_observation_space.spaces.items()},
            "action": tuple(env.single_action_space.shape),
            "max_episode_steps": env.max_episode_steps,
            "instruction": env.instruction[0],
        }
    finally:
        env.close()
