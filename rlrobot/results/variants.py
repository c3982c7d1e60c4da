"""Contact-study variants of the SO-101 tasks (``so101-lift-contacts-0.005``, ``so101-push-nofloor`` ...): the task
with other contact / floor options (``SO101Env``'s ``contact_solref``, ``jaw_solref``, ``jaw_tip_floor``).

They are registered only by ``register_variants()``, which ``rlrobot results exec`` / ``experts`` call before
running: ``rlrobot list-tasks`` and the test suite's task lists keep the published tasks only.
"""

from __future__ import annotations

from typing import Any

from rlrobot.results.registry import STUDY_VARIANTS

BASE_TASKS = ("so101-push", "so101-lift")


def variant_options(task_id: str) -> tuple[str, dict[str, Any]] | None:
    """(base task, task options) of a variant id, None for any other id."""
    for base in BASE_TASKS:
        for variant, (_, options) in STUDY_VARIANTS.items():
            if task_id == f"{base}-{variant}":
                return base, dict(options)
    return None


def register_variants() -> list[str]:
    """Register every study variant (idempotent); returns their ids."""
    from rlrobot.envs.registry import TaskSpec, native_task_ids, register_task, task_spec
    from rlrobot.tasks.so101 import TASKS

    known, ids = set(native_task_ids()), []
    for base in BASE_TASKS:
        for variant, (_, options) in STUDY_VARIANTS.items():
            task_id = f"{base}-{variant}"
            ids.append(task_id)
            if task_id in known:
                continue
            base_cls = TASKS[base]
            cls = type(f"{base_cls.__name__}_{variant.replace('-', '_').replace('.', '_')}", (base_cls,),
                       {"task_name": task_id, "__init__": _init_with(base_cls, options)})
            spec = task_spec(base)
            register_task(TaskSpec(task_id, cls, spec.obs_modes, spec.reward_modes, spec.control_modes,
                                   spec.default_max_episode_steps))
    return ids


def _init_with(base_cls: type, options: dict[str, Any]):
    def __init__(self, num_envs: int, **kw: Any) -> None:
        base_cls.__init__(self, num_envs, **{**options, **kw})

    return __init__
