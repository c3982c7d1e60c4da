"""Contact-study variants of the SO-101 push and lift tasks (``so101-lift-contacts-0.005``, ``so101-push-nofloor``,
...): the task built with other contact / floor options (``SO101Env``'s ``contact_solref``, ``jaw_solref``,
``jaw_tip_floor``). Registered unlisted: reachable by id everywhere (train, eval, collect, the results registry's
study rows), not shown by ``rlrobot list-tasks``."""

from __future__ import annotations

from typing import Any

from rlrobot.tasks.registry import TaskSpec, register_task, task_spec

STUDY_VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "contacts-0.005": ("old contacts (solref 0.005), with the floor", {"contact_solref": 0.005}),
    "nofloor": ("today's contacts (0.03), no Cartesian floor", {"jaw_tip_floor": None}),
    "contacts-0.005-nofloor": ("old contacts (0.005), no floor: the physics of the 0.98 run",
                               {"contact_solref": 0.005, "jaw_tip_floor": None}),
    "jaws-0.005": ("stiff jaw contacts (jaw solref 0.005), soft cube/table (0.03), with the floor",
                   {"jaw_solref": 0.005}),
}
"""variant name -> (what it changes, the task options it is built with)"""
BASE_TASKS = ("so101-push", "so101-lift")

for _base in BASE_TASKS:
    _spec = task_spec(_base)
    for _variant, (_, _options) in STUDY_VARIANTS.items():
        register_task(TaskSpec(f"{_base}-{_variant}", _spec.entry_point, _spec.obs_modes, _spec.reward_modes,
                               _spec.control_modes, _spec.default_max_episode_steps, options=_spec.options,
                               default_options=tuple(_options.items()), listed=False))
