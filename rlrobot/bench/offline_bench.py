"""(f) offline RL in ``rlrobot bench``: gradient steps per second of every registered offline algorithm (BC, IQL,
Cal-QL, FQL, RQL, ...) at its preset for the task (``configs/<algo>_<task>.py``; the algorithm's defaults where there
is none), on a synthetic dataset of the task's observation and action sizes (a step's cost does not depend on the
data's values), in the bench's torch thread count. What ``rlrobot offline-bench`` and the README's offline table
spend their time on."""

from __future__ import annotations

import time
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

import rlrobot
from rlrobot.algorithms.offline import offline_algorithm_names
from rlrobot.configs import preset
from rlrobot.data.transitions import synthetic_transitions

console = Console(soft_wrap=True)


def gradient_steps_per_s(algo: str, task: str, obs_dim: int, action_dim: int, seconds: float, device: str = "cpu"
                         ) -> dict[str, Any]:
    cfg = preset(task, algo)
    section = cfg.algorithm
    data = synthetic_transitions((100,) * 20, obs_dim=obs_dim, action_dim=action_dim, gamma=section.gamma, device=device)
    extra = {}
    if hasattr(section, "expert_dataset"):  # offline imitation (ReCOIL, BC on the union): demonstrations beside the data
        extra["expert"] = synthetic_transitions((100,) * 5, obs_dim=obs_dim, action_dim=action_dim, gamma=section.gamma,
                                                device=device, seed=1)
    learner = cfg.spec.learner(section, obs_dim, action_dim, data, device, torch.Generator(device=device).manual_seed(0),
                               **extra)
    for _ in range(3):  # warm-up: allocator, optimizer state
        learner.update()
    steps, start = 0, time.perf_counter()
    while True:
        learner.update()
        steps += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds and steps >= 3:
            break
    return {"algo": algo, "hidden": list(section.hidden), "batch_size": section.batch_size,
            "gradient_steps_per_s": steps / elapsed, "steps": steps}


def offline_bench(args) -> list[dict[str, Any]]:
    """One row per offline algorithm; ``args`` is ``BenchArgs`` (task, seconds, torch_threads)."""

    env = rlrobot.make(args.task, 1, seed=0, control_mode=args.control_mode)
    obs_dim, action_dim = int(env.single_observation_space["state"].shape[0]), int(env.single_action_space.shape[0])
    env.close()
    torch.set_num_threads(args.torch_threads)
    rows = [gradient_steps_per_s(algo, args.task, obs_dim, action_dim, args.seconds) for algo in offline_algorithm_names()]
    table = Table(title=f"(f) offline RL: {args.task} presets, gradient steps/s ({args.torch_threads} torch thread(s))")
    for col in ("algo", "hidden", "batch", "gradient steps/s"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r["algo"], "x".join(map(str, r["hidden"])), str(r["batch_size"]), f"{r['gradient_steps_per_s']:,.0f}")
    console.print(table)
    return rows
