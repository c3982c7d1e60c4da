"""``rlrobot bench`` (g): the process reward model's inference cost per env step, beside the cost of the
env step itself, measured in the same run on so101-suite (state obs) at ``prm_num_envs`` envs.

The PRM is the preset's network (``configs/prm_so101_suite.py``; weights do not change the cost) or a trained one
(``--prm-checkpoint``): one batched ``progress(obs_before, obs_after, instruction_embedding)`` call per env step,
the delta and the done probability, as the ``prm:PATH`` reward wrapper makes it.
"""

from __future__ import annotations

import time

import torch
from rich.table import Table

import rlrobot
from rlrobot.configs import preset
from rlrobot.rewards.progress_model import VLACProgressModel, load_progress_model


def prm_bench(num_envs: int = 256, seconds: float = 3.0, checkpoint: str = "", num_threads: int = 0,
              console=None) -> dict:
    env = rlrobot.make("so101-suite", num_envs, seed=0, num_threads=num_threads or None)
    obs, _ = env.reset(seed=0)
    if checkpoint:
        model = load_progress_model(checkpoint, "cpu", observation_space=env.single_observation_space)
    else:
        space = env.single_observation_space
        net = preset("so101-suite", "prm").prm_net.for_observation_space(space)
        model = VLACProgressModel({k: list(space[k].shape) for k in net.obs_keys}, net).eval()
    gen = torch.Generator().manual_seed(0)
    actions = [torch.rand(num_envs, env.action_dim, generator=gen) * 2 - 1 for _ in range(8)]
    env.step(actions[0])  # warm up
    steps, start = 0, time.perf_counter()
    frames = []
    while time.perf_counter() - start < seconds or steps < 2:
        nxt = env.step(actions[steps % 8])[0]
        if len(frames) < 8:
            frames.append(nxt)
        steps += 1
    env_s = (time.perf_counter() - start) / steps
    env.close()
    model.progress(obs, frames[0], obs["instruction_embedding"])  # warm up
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        before, after = frames[calls % len(frames)], frames[(calls + 1) % len(frames)]
        model.progress(before, after, after["instruction_embedding"])
        calls += 1
    prm_s = (time.perf_counter() - start) / calls
    row = {"num_envs": num_envs, "env_step_ms": 1e3 * env_s, "prm_ms": 1e3 * prm_s, "prm_over_env": prm_s / env_s,
           "env_steps_per_s": num_envs / env_s, "prm_pairs_per_s": num_envs / prm_s,
           "checkpoint": checkpoint or "preset network (untrained weights)", "torch_threads": torch.get_num_threads()}
    if console is not None:
        table = Table(title="(g) process reward model per env step, so101-suite state (same run)")
        for col in ("num_envs", "env step ms", "PRM ms", "PRM / env step", "env steps/s", "PRM pairs/s"):
            table.add_column(col, justify="right")
        table.add_row(str(num_envs), f"{row['env_step_ms']:.2f}", f"{row['prm_ms']:.2f}", f"{row['prm_over_env']:.2f}",
                      f"{row['env_steps_per_s']:,.0f}", f"{row['prm_pairs_per_s']:,.0f}")
        console.print(table)
    return row
