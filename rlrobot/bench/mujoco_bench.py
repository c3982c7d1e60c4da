"""The native MuJoCo benches of ``rlrobot bench``: raw batched physics vs the VecEnv vs PPO training, measured in one run.

(a) raw: ``mj_step`` x frame_skip on every MjData through the same thread pool, nothing else;
(b) VecEnv: ``env.step`` with random actions (action mapping, IK, gather, rewards, observations, autoreset);
(c) PPO: a real training run (``OnPolicyRunner.learn()``, as ``rlrobot train``) of the task's PPO preset (its network,
    epochs, minibatches and optimizer; ``configs/ppo_<task>.py``) at each num_envs: its env steps over its training wall
    time, every iteration counted (rollout with policy inference, update, normaliser), no warm-up discarded.
(d) SAC at the task's SAC preset (its num_envs, UTD and batch): gradient updates/s and training env steps/s with a
    warm replay buffer, against collection alone (no updates) and (a) measured at the same num_envs.
(e) images: the VecEnv with two 64x64 cameras against state only (env steps/s, frames/s).
For reference it also times ``mujoco.rollout`` on the same batch (physics only, state arrays in and out): the
thread pool is kept because the tasks need per-env kinematics and Jacobians that rollout does not return.
All in env steps per second (one env step = one control step = frame_skip physics steps).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch
from rich.table import Table

import rlrobot
from rlrobot.bench.common import console, ppo_bench_config, ppo_rate, rate, rollout_rate, vecenv_rate
from rlrobot.configs import preset
from rlrobot.runners.off_policy import OffPolicyRunner

if TYPE_CHECKING:
    from rlrobot.commands.bench import BenchArgs


def native_bench(args: BenchArgs) -> list[dict]:
    """(a) raw physics, (a') mujoco.rollout, (b) the VecEnv and (c) PPO training at each ``args.num_envs``: one row each."""
    torch.set_num_threads(args.torch_threads)
    rows = []
    for n in args.num_envs:
        env = rlrobot.make(args.task, n, seed=0, control_mode=args.control_mode, num_threads=args.num_threads or None)
        env.reset(seed=0)
        raw = rate(env.raw_step, n, args.seconds)
        via_rollout = rollout_rate(env, args.seconds)
        env.reset(seed=0)
        vec = vecenv_rate(env, n, args.seconds)
        env.close()
        cfg = ppo_bench_config(args.task, n, args.ppo_hidden, control_mode=args.control_mode, num_threads=args.num_threads,
                               torch_threads=args.torch_threads, update_threads=args.update_threads)
        ppo = ppo_rate(cfg, args.ppo_iterations)
        rows.append({"num_envs": n, "raw_steps_per_s": raw, "rollout_steps_per_s": via_rollout,
                     "vecenv_steps_per_s": vec, "ppo_steps_per_s": ppo,
                     "b_over_a": vec / raw, "c_over_a": ppo / raw})

    table = Table(title=f"rlrobot bench: {args.task} ({args.control_mode}), env steps/s")
    for col in ("num_envs", "(a) raw mj_step", "(a') mujoco.rollout", "(b) VecEnv", "(c) PPO train", "b/a", "c/a"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(str(r["num_envs"]), f"{r['raw_steps_per_s']:,.0f}", f"{r['rollout_steps_per_s']:,.0f}",
                      f"{r['vecenv_steps_per_s']:,.0f}",
                      f"{r['ppo_steps_per_s']:,.0f}", f"{r['b_over_a']:.2f}", f"{r['c_over_a']:.2f}")
    console.print(table)
    return rows


def images_bench(args: BenchArgs) -> dict:
    """VecEnv steps/s with obs_mode state and state+rgb (two 64x64 cameras), measured alternately (state, images,
    state, images) so that machine load hits both; frames/s = env steps/s x cameras."""

    n = args.images_num_envs
    rates: dict[str, list[float]] = {"state": [], "state+rgb": []}
    cameras = 0
    for mode in ("state", "state+rgb") * 2:
        env = rlrobot.make(args.task, n, seed=0, control_mode=args.control_mode, obs_mode=mode,
                           num_threads=args.num_threads or None)
        env.reset(seed=0)
        rates[mode].append(vecenv_rate(env, n, args.seconds))
        cameras = len(env.cameras)
        env.close()
    state, rgb = (sum(rates[m]) / 2 for m in ("state", "state+rgb"))
    row = {"num_envs": n, "cameras": cameras, "image_size": 64, "state_steps_per_s": state, "rgb_steps_per_s": rgb,
           "frames_per_s": rgb * cameras, "rgb_over_state": rgb / state, "samples": rates}
    table = Table(title=f"images: {args.task}, {n} envs, {cameras} cameras 64x64 rendered in the worker threads")
    for col in ("state env steps/s", "state+rgb env steps/s", "frames/s", "rgb/state"):
        table.add_column(col, justify="right")
    table.add_row(f"{state:,.0f}", f"{rgb:,.0f}", f"{row['frames_per_s']:,.0f}", f"{row['rgb_over_state']:.2f}")
    console.print(table)
    return row


def sac_bench(args: BenchArgs) -> dict:
    """SAC throughput at the preset's UTD: updates dominate on a CPU, so report both rates and the cost ratio."""

    cfg = preset(args.task, "sac")
    cfg.logger, cfg.out, cfg.total_steps = "none", "/tmp/rlrobot-bench-sac", 10**9
    cfg.control_mode, cfg.num_threads, cfg.torch_threads = args.control_mode, args.num_threads, args.torch_threads
    n = cfg.num_envs
    env = rlrobot.make(cfg.task, n, seed=0, control_mode=args.control_mode, num_threads=args.num_threads or None)
    env.reset(seed=0)
    raw = rate(env.raw_step, n, min(args.seconds, args.sac_seconds))
    env.close()
    runner = OffPolicyRunner(cfg)
    runner.obs, _ = runner.env.reset(seed=0)
    per_iteration = runner.steps_per_iteration
    while len(runner.replay) < cfg.sac.learning_starts:  # warm buffer, random actions, no timing
        runner._collect()
        runner.env_steps += per_iteration
    runner.train_iteration()  # warm up

    def timed(fn) -> tuple[float, int]:
        start, iterations = time.perf_counter(), 0
        while time.perf_counter() - start < args.sac_seconds:
            fn()
            iterations += 1
        return time.perf_counter() - start, iterations

    updates_before = runner.algo.num_updates
    elapsed, iterations = timed(runner.train_iteration)
    updates = runner.algo.num_updates - updates_before
    collect_elapsed, collect_iterations = timed(runner._collect)
    runner.env.close()
    row = {"num_envs": n, "utd": cfg.sac.utd, "batch_size": cfg.sac.batch_size, "raw_steps_per_s": raw,
           "sac_updates_per_s": updates / elapsed, "sac_env_steps_per_s": iterations * per_iteration / elapsed,
           "collect_steps_per_s": collect_iterations * per_iteration / collect_elapsed}
    row["train_over_collect"] = row["sac_env_steps_per_s"] / row["collect_steps_per_s"]
    row["train_over_raw"] = row["sac_env_steps_per_s"] / raw
    table = Table(title=f"SAC at the {args.task} preset (num_envs {n}, UTD {cfg.sac.utd}, batch {cfg.sac.batch_size})")
    for col in ("(a) raw mj_step", "collect only", "(d) SAC train env steps/s", "SAC updates/s", "d/collect", "d/a"):
        table.add_column(col, justify="right")
    table.add_row(f"{raw:,.0f}", f"{row['collect_steps_per_s']:,.0f}", f"{row['sac_env_steps_per_s']:,.0f}",
                  f"{row['sac_updates_per_s']:,.0f}", f"{row['train_over_collect']:.3f}", f"{row['train_over_raw']:.3f}")
    console.print(table)
    return row
