"""``rlrobot list-tasks`` and ``rlrobot list-algos``: what the registries hold."""

from __future__ import annotations

import json
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from rlrobot.algorithms.registry import describe_algorithms
from rlrobot.envs.registry import describe_task, native_task_ids, task_spec
from rlrobot.tasks.so101_suite import SUITE_TASKS

console = Console(soft_wrap=True)


@dataclass
class ListTasksArgs:
    instructions: str | None = None
    """a language-suite task id (so101-suite, so101-pick-place, ...): print every instruction it draws, one per line
    (what `rlrobot train --instruction` takes)"""


def list_tasks(args: ListTasksArgs) -> None:
    if args.instructions is not None:
        if args.instructions not in SUITE_TASKS:
            raise ValueError(f"instructions={args.instructions!r} is not a language-suite task; one of {sorted(SUITE_TASKS)}")
        for text in SUITE_TASKS[args.instructions].instructions():
            print(text)
        return

    table = Table(title="rlrobot tasks")
    for col in ("task", "observation", "action", "max steps", "instruction"):
        table.add_column(col)
    for task in native_task_ids():
        d = describe_task(task)
        table.add_row(task, json.dumps(d["observation"]), str(d["action"]), str(d["max_episode_steps"]), d["instruction"])
    console.print(table)

    for task in native_task_ids():
        spec = task_spec(task)
        console.print(f"{task}: obs_mode {' | '.join(spec.obs_modes)}; control_mode {' | '.join(spec.control_modes)}; "
                      f"reward_mode {' | '.join(spec.reward_modes)}")
    console.print("Other simulators by prefix: gym:<id> (any registered gymnasium env, e.g. gym:Pendulum-v1), "
                  "maniskill:<id> (extra maniskill, e.g. maniskill:PushCube-v1), isaaclab:<task> (Isaac Lab installed)")


@dataclass
class ListAlgosArgs:
    """No options: every registered algorithm is listed."""


def list_algorithms(args: ListAlgosArgs | None = None) -> None:
    table = Table(title="rlrobot algorithms (rlrobot train --algo NAME --help)")
    for col in ("algo", "policy kind", "what it does"):
        table.add_column(col)
    for row in describe_algorithms():
        table.add_row(row["algo"], row["policy_kind"], row["summary"])
    console.print(table)
