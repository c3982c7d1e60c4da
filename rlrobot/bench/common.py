"""What the benches share: timing a callable in env steps/s, the VecEnv and ``mujoco.rollout`` rates, and a real PPO
training run of a task's preset (``rlrobot train``'s path) timed end to end."""

from __future__ import annotations

import dataclasses
import tempfile
import time
from contextlib import redirect_stdout
from io import StringIO

import mujoco
import numpy as np
import torch
from mujoco import rollout
from rich.console import Console

from rlrobot.configs import preset
from rlrobot.runners.on_policy import OnPolicyRunner

console = Console(width=max(Console().width, 110))


def rate(fn, num_envs: int, seconds: float) -> float:
    fn()  # warm up (thread pool, caches)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn()
        steps += 1
    return steps * num_envs / (time.perf_counter() - start)


def vecenv_rate(env, num_envs: int, seconds: float) -> float:
    """``env.step`` with a cycle of 8 fixed random action batches (drawn once, outside the timing)."""
    gen = torch.Generator().manual_seed(0)
    actions = [(torch.rand(num_envs, env.action_dim, generator=gen) * 2 - 1).to(env.device) for _ in range(8)]
    k = [0]

    def step():
        env.step(actions[k[0] % 8])
        k[0] += 1

    return rate(step, num_envs, seconds)


def ppo_bench_config(task: str, num_envs: int, hidden: tuple[int, ...] = (), **fields):
    """The task's PPO preset (``rlrobot train --algo ppo --task TASK``) at ``num_envs`` envs, ``fields`` set on top."""
    cfg = dataclasses.replace(preset(task, "ppo"), num_envs=num_envs, total_steps=10**9, logger="none", **fields)
    if hidden:
        cfg.policy.actor_hidden = cfg.policy.critic_hidden = tuple(hidden)
    return cfg


def ppo_rate(cfg, iterations: int) -> float:
    """Env steps/s of a real training run: ``OnPolicyRunner.learn()`` (what ``rlrobot train`` runs) for ``iterations``
    iterations from a fresh runner, its env steps over its training wall time (every iteration counted, the first
    included: rollout with policy inference, update, normaliser, logging; the final evaluation of 1 episode and the
    checkpoint writes are outside it, as in the figure ``rlrobot train`` prints)."""
    with tempfile.TemporaryDirectory(prefix="rlrobot-bench-") as out:
        cfg.out, cfg.logger, cfg.video = out, "none", False
        cfg.total_steps = iterations * cfg.num_envs * cfg.ppo.rollout_steps
        cfg.eval_every, cfg.eval_envs, cfg.eval_episodes, cfg.checkpoint_every = 0, 1, 1, 10**6
        runner = OnPolicyRunner(cfg)
        with redirect_stdout(StringIO()):
            summary = runner.learn()
        runner.env.close()
    return summary["env_steps"] / runner.wall_time


def rollout_rate(env, seconds: float) -> float:
    """Physics-only env steps/s of ``mujoco.rollout`` (C threads, state arrays in and out), for comparison with (a)."""
    spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
    state = np.zeros((env.num_envs, mujoco.mj_stateSize(env.model, spec)))
    for i, d in enumerate(env.datas):
        mujoco.mj_getState(env.models[env.model_index[i]], d, state[i], spec)
    control = np.repeat(env.ctrl[:, None, :], env.frame_skip, axis=1)
    models = [env.models[j] for j in env.model_index]
    scratch = [mujoco.MjData(env.model) for _ in range(env.num_threads)]
    with rollout.Rollout(nthread=env.num_threads) as r:
        def step():
            nonlocal state
            out, _ = r.rollout(models, scratch, state, control, nstep=env.frame_skip)
            state = out[:, -1].copy()

        return rate(step, env.num_envs, seconds)
