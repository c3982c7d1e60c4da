"""What the registries hold, as a JSON file shipped with the package, so that ``rlrobot list-tasks`` and ``rlrobot
list-algos`` answer without importing torch, MuJoCo or any task (a cold import of those takes seconds; reading the
file, milliseconds). A test rebuilds the catalogue from the registries and fails when the file is stale:
``python -m rlrobot.catalogue`` rewrites it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CATALOGUE_PATH = Path(__file__).with_name("catalogue.json")


def build_catalogue() -> dict[str, Any]:
    """Every native task (its default spaces, episode length, an instruction, its modes) and every algorithm."""
    # the registries load torch and every task: only when the catalogue is rebuilt, never when it is read
    from rlrobot.algorithms.registry import describe_algorithms
    from rlrobot.tasks.registry import describe_task, native_task_ids, task_spec

    tasks = []
    for task in native_task_ids():
        spec, described = task_spec(task), describe_task(task)
        tasks.append({**described, "observation": {k: list(v) for k, v in described["observation"].items()},
                      "action": list(described["action"]), "obs_modes": list(spec.obs_modes),
                      "control_modes": list(spec.control_modes), "reward_modes": list(spec.reward_modes)})
    return {"tasks": tasks, "algorithms": describe_algorithms()}


def render(catalogue: dict[str, Any]) -> str:
    return json.dumps(catalogue, indent=1) + "\n"


def load_catalogue() -> dict[str, Any]:
    return json.loads(CATALOGUE_PATH.read_text())


if __name__ == "__main__":
    CATALOGUE_PATH.write_text(render(build_catalogue()))
    print(f"wrote {CATALOGUE_PATH}")
