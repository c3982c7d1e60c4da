"""``rlrobot list-tasks`` and ``rlrobot list-algos``: what the registries hold, read from the package's catalogue
(``rlrobot/catalogue.py``) so that neither command imports torch or a simulator."""

from __future__ import annotations

import json
from dataclasses import dataclass

from rich.console import Console

from rlrobot.catalogue import load_catalogue
from rlrobot.logging.tables import print_table

console = Console(soft_wrap=True)


@dataclass
class ListTasksArgs:
    instructions: str | None = None
    """a language-suite task id (so101-suite, so101-pick-place, ...): print every instruction it draws, one per line
    (what `rlrobot train --instruction` takes)"""


def list_tasks(args: ListTasksArgs) -> None:
    if args.instructions is not None:
        from rlrobot.tasks.so101_suite import SUITE_TASKS  # builds the suite's vocabulary: only for this option

        if args.instructions not in SUITE_TASKS:
            raise ValueError(f"instructions={args.instructions!r} is not a language-suite task; one of {sorted(SUITE_TASKS)}")
        for text in SUITE_TASKS[args.instructions].instructions():
            print(text)
        return

    tasks = load_catalogue()["tasks"]
    rows = [(t["task"], json.dumps(t["observation"]), str(tuple(t["action"])), str(t["max_episode_steps"]), t["instruction"])
            for t in tasks]
    print_table(console, "rlrobot tasks", ("task", "observation", "action", "max steps", "instruction"), rows)
    for t in tasks:
        console.print(f"{t['task']}: obs_mode {' | '.join(t['obs_modes'])}; control_mode {' | '.join(t['control_modes'])}; "
                      f"reward_mode {' | '.join(t['reward_modes'])}", highlight=False)
    console.print("Other simulators by prefix: gym:<id> (any registered gymnasium env, e.g. gym:Pendulum-v1), "
                  "maniskill:<id> (extra maniskill, e.g. maniskill:PushCube-v1), isaaclab:<task> (Isaac Lab installed)",
                  highlight=False)


@dataclass
class ListAlgosArgs:
    """No options: every registered algorithm is listed."""


def list_algorithms(args: ListAlgosArgs | None = None) -> None:
    rows = [(a["algo"], a["policy_kind"], a["summary"]) for a in load_catalogue()["algorithms"]]
    print_table(console, "rlrobot algorithms (rlrobot train --algo NAME --help)", ("algo", "policy kind", "what it does"), rows)
