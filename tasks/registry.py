"""``rlrobot.make``: one factory for native tasks and simulator adapters, and the task registry.

Native tasks register a ``TaskSpec`` (their id, entry point and the observation / reward / control modes they
support) from their own module; ``rlrobot.tasks`` imports those modules. Other simulators' tasks are named by prefix
(``gym:Pendulum-v1``, ``maniskill:PickCube-v1``, ``isaaclab:...``) and looked up in their own registries.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlrobot.envs.vec_env import VecEnv

BACKENDS = ("mujoco", "mjwarp", "gymnasium", "maniskill", "isaaclab")
NATIVE_BACKENDS = ("mujoco", "mjwarp")  # the native MJCF tasks run on either: same task code, different physics
ADAPTER_PREFIXES = {"gym": "gymnasium", "maniskill": "maniskill", "isaaclab": "isaaclab"}


@dataclass(frozen=True)
class TaskSpec:
    id: str
    entry_point: Callable[..., VecEnv]
    """(num_envs, device=, seed=, **task_options) -> VecEnv (a MujocoVecEnv subclass for the native backends)"""
    obs_modes: tuple[str, ...]
    reward_modes: tuple[str, ...]
    control_modes: tuple[str, ...]
    default_max_episode_steps: int
    has_expert: bool = True
    """a scripted expert (``expert_action()``) exists: ``rlrobot collect`` can record demonstrations"""
    options: tuple[str, ...] = ()
    """run options beyond the modes that the task takes (``servo_limits``, a suite's ``instruction``)"""
    check_option: Callable[[str, str, Any], None] | None = None
    """(task id, option, value) -> None or a one-line ValueError: what the task accepts as an option's value"""
    default_options: tuple[tuple[str, Any], ...] = ()
    """options the entry point is always built with: a variant of another task (``make`` lets the caller override)"""
    listed: bool = True
    """shown by ``rlrobot list-tasks`` and in the task lists (False: study variants, reachable by id)"""


_TASKS: dict[str, TaskSpec] = {}


def register_task(spec: TaskSpec) -> TaskSpec:
    if spec.id in _TASKS and _TASKS[spec.id] != spec:
        raise ValueError(f"task {spec.id!r} is registered twice")
    _TASKS[spec.id] = spec
    return spec


def is_adapter_task(task_id: str) -> bool:
    """A task of another simulator named by its prefix (``gym:...``, ``maniskill:...``, ``isaaclab:...``), as opposed to
    a native task of this package."""
    return ":" in task_id


def native_task_ids(listed_only: bool = True) -> list[str]:
    """The native tasks' ids (``listed_only``: without the study variants)."""
    import rlrobot.tasks  # noqa: F401  (native task modules register themselves on import)

    return sorted(task for task, spec in _TASKS.items() if spec.listed or not listed_only)


def check_task_option(task_id: str, name: str, value: Any) -> None:
    """Refuse, in one line, a run option the task does not take or a value it does not accept."""
    takers = [t for t in native_task_ids() if name in _TASKS[t].options]
    if is_adapter_task(task_id) or name not in task_spec(task_id).options:
        raise ValueError(f"{name} applies to the tasks {', '.join(takers)}; not to task={task_id!r}")
    spec = task_spec(task_id)
    if spec.check_option is not None:
        spec.check_option(task_id, name, value)


def task_spec(task_id: str) -> TaskSpec:
    validate_task_id(task_id)
    if is_adapter_task(task_id):
        raise ValueError(f"task={task_id!r} is an adapter task; it has no native task spec")
    return _TASKS[task_id]


def validate_task_modes(task_id: str, **modes: str) -> None:
    """``obs_mode=``, ``reward_mode=``, ``control_mode=`` against what the task registered."""
    spec = task_spec(task_id)
    for name, value in modes.items():
        allowed = getattr(spec, name.replace("_mode", "_modes"))
        if value not in allowed:
            raise ValueError(f"{name}={value!r} is not one of {allowed} (task {task_id})")


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
            from rlrobot.tasks.maniskill_adapter import registered_ids  # an optional simulator: loaded for its prefix only

            if name not in registered_ids():  # ImportError with the install line when ManiSkill is missing
                raise ValueError(f"task={task_id!r}: ManiSkill has no env id {name!r}")
        elif prefix == "isaaclab":
            from rlrobot.tasks.isaaclab_adapter import require_isaaclab  # an optional simulator: loaded for its prefix only

            require_isaaclab()  # ImportError naming what to install
            import gymnasium

            if name not in gymnasium.registry:
                raise ValueError(f"task={task_id!r}: Isaac Lab registers no task {name!r}")
        return
    if task_id not in native_task_ids(listed_only=False):
        close = difflib.get_close_matches(task_id, native_task_ids(), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ValueError(
            f"task={task_id!r} is not a known task; {hint}valid tasks: {native_task_ids()} or a prefixed id such as "
            "'gym:Pendulum-v1', 'maniskill:PickCube-v1', 'isaaclab:<task>'"
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
        from rlrobot.tasks.mjwarp_backend import require_mujoco_warp  # optional (warp extra): loaded when asked for

        require_mujoco_warp()
    return backend


def make(
    task_id: str,
    num_envs: int = 1,
    *,
    backend: str | None = None,
    device: str | torch.device | None = None,
    seed: int | None = None,
    reward_wrappers: Sequence[Callable[[VecEnv], VecEnv]] = (),
    **task_options: Any,
) -> VecEnv:
    """Build a batched env. Native tasks by name (``so101-reach``), other simulators by prefix (``gym:...``).
    ``reward_wrappers`` (env -> env, e.g. ``RewardConfig(shaping="dense-potential").wrappers(0.99)``) wrap it in order."""
    env = _make(task_id, num_envs, backend, device, seed, task_options)
    for wrap in reward_wrappers:
        env = wrap(env)
    return env


def _make(task_id: str, num_envs: int, backend: str | None, device, seed: int | None, task_options: dict[str, Any]
          ) -> VecEnv:
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    validate_task_id(task_id)
    backend = resolve_backend(task_id, backend)
    name = task_id.partition(":")[2]
    device = torch.device(device or "cpu")
    if backend == "gymnasium":
        from rlrobot.tasks.gymnasium_adapter import GymnasiumVecEnv  # adapters load for their prefix only

        return GymnasiumVecEnv(name, num_envs, device=device, seed=seed, **task_options)
    if backend == "maniskill":
        from rlrobot.tasks.maniskill_adapter import ManiSkillVecEnv  # adapters load for their prefix only

        return ManiSkillVecEnv(name, num_envs, device=device, seed=seed, **task_options)
    if backend == "isaaclab":
        from rlrobot.tasks.isaaclab_adapter import IsaacLabVecEnv  # adapters load for their prefix only

        return IsaacLabVecEnv(name, num_envs, device=device, seed=seed, **task_options)
    spec = _TASKS[task_id]
    task_cls = spec.entry_point
    task_options = {**dict(spec.default_options), **task_options}
    if backend == "mjwarp":
        from rlrobot.tasks.mjwarp_backend import mjwarp_task_class  # optional (warp extra): loaded when asked for

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
