"""``rlrobot bench``: raw batched physics vs the VecEnv vs PPO training, measured in one run.

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

import dataclasses
import json
import time
from dataclasses import dataclass, field

import torch
from rich.console import Console
from rich.table import Table

from rlrobot.bench.peers_bench import PeerSettings, run_peers_bench

console = Console(width=max(Console().width, 110))


BENCH_BACKENDS = ("mujoco", "mjwarp", "maniskill")


@dataclass
class BenchArgs:
    task: str = "so101-reach"
    num_envs: tuple[int, ...] = (64, 256, 1024)
    seconds: float = 3.0
    """time budget for each of (a) and (b) at each size"""
    ppo_iterations: int = 5
    """iterations of the real PPO training run timed for (c)"""
    ppo_hidden: tuple[int, ...] = ()
    """hidden widths of the actor and the critic in (c) (() = the task's PPO preset's)"""
    num_threads: int = 0
    torch_threads: int = 1
    update_threads: int = 0
    """torch threads of the PPO update in (c) (0 = all cores, the train default; on a loaded machine 1 is faster)"""
    control_mode: str = "ee_delta"
    sac: bool = True
    """also time SAC training at the task's SAC preset (UTD, batch, num_envs)"""
    sac_seconds: float = 5.0
    json_out: str | None = None
    offline: bool = True
    """(f) gradient steps/s of every offline RL algorithm at its preset (rlrobot.bench.offline_bench)"""
    backend: str = "mujoco"
    """mujoco (native tasks) | mjwarp (native task on MuJoCo Warp vs native, same run) | maniskill (its vector env vs
    our adapter vs PPO; task maniskill:PushCube-v1 unless --task names a maniskill: task)"""
    device: str = "auto"
    """where the mjwarp bench runs Warp and PPO: auto (cuda if available) | cpu | cuda"""
    ppo_steps: int = 16
    """rollout length of the PPO iterations in the mjwarp and maniskill benches"""
    images: bool = True
    """also time the VecEnv with two 64x64 cameras (obs_mode state+rgb, rendered in the worker threads) against
    state only, at images_num_envs envs: env steps/s, frames/s and their ratio"""
    images_num_envs: int = 64
    peers: bool = False
    """time Stable-Baselines3 PPO / SAC, rsl_rl PPO and EnvPool against rlrobot on the same task, network and batch,
    interleaved in this one run, and print the ratios (needs the extra: pip install 'rlrobot[bench]')"""
    peer: PeerSettings = field(default_factory=PeerSettings)
    """settings of --peers (task, envs, rollout, epochs, minibatch, network, rounds)"""
    prm: bool = True
    """(g) the process reward model's inference per env step beside the env step, so101-suite (rlrobot.bench.prm_bench)"""
    prm_num_envs: int = 256
    """envs of (g) (at most the largest --num-envs of the run)"""
    prm_checkpoint: str = ""
    """a trained PRM for (g) ('' = the preset's network; the weights do not change the cost)"""

    def __post_init__(self):
        if self.backend not in BENCH_BACKENDS:
            raise ValueError(f"backend={self.backend!r} is not one of {BENCH_BACKENDS}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device={self.device!r} is not one of ('auto', 'cpu', 'cuda', 'cuda:N')")


def _rate(fn, num_envs: int, seconds: float) -> float:
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

    return _rate(step, num_envs, seconds)


def ppo_bench_config(task: str, num_envs: int, hidden: tuple[int, ...] = (), **fields):
    """The task's PPO preset (``rlrobot train --algo ppo --task TASK``) at ``num_envs`` envs, ``fields`` set on top."""
    from rlrobot.configs import preset

    cfg = dataclasses.replace(preset(task, "ppo"), num_envs=num_envs, total_steps=10**9, logger="none", **fields)
    if hidden:
        cfg.policy.actor_hidden = cfg.policy.critic_hidden = tuple(hidden)
    return cfg


def ppo_rate(cfg, iterations: int) -> float:
    """Env steps/s of a real training run: ``OnPolicyRunner.learn()`` (what ``rlrobot train`` runs) for ``iterations``
    iterations from a fresh runner, its env steps over its training wall time (every iteration counted, the first
    included: rollout with policy inference, update, normaliser, logging; the final evaluation of 1 episode and the
    checkpoint writes are outside it, as in the figure ``rlrobot train`` prints)."""
    import tempfile
    from contextlib import redirect_stdout
    from io import StringIO

    from rlrobot.runners.on_policy import OnPolicyRunner

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
    import mujoco
    import numpy as np
    from mujoco import rollout

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

        return _rate(step, env.num_envs, seconds)


def run_bench(args: BenchArgs) -> dict:
    if args.peers:
        result = run_peers_bench(args.peer, progress_json=args.json_out)
        if args.json_out:
            with open(args.json_out, "w") as f:
                json.dump(result, f, indent=2)
        return result
    if args.backend != "mujoco":
        if args.backend == "mjwarp":
            from rlrobot.bench.mjwarp_bench import run_mjwarp_bench as run_other
        else:
            from rlrobot.bench.adapter_bench import run_adapter_bench as run_other
        result = run_other(args)
        if args.json_out:
            with open(args.json_out, "w") as f:
                json.dump(result, f, indent=2)
        return result
    import rlrobot

    torch.set_num_threads(args.torch_threads)
    rows = []
    for n in args.num_envs:
        env = rlrobot.make(args.task, n, seed=0, control_mode=args.control_mode, num_threads=args.num_threads or None)
        env.reset(seed=0)
        raw = _rate(env.raw_step, n, args.seconds)
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
    result: dict = {"ppo": rows}
    if args.images:
        result["images"] = images_bench(args)
    if args.sac:
        result["sac"] = sac_bench(args)
    if args.offline:
        from rlrobot.bench.offline_bench import offline_bench

        result["offline"] = offline_bench(args)
    if args.prm:
        from rlrobot.bench.prm_bench import prm_bench

        result["prm"] = prm_bench(min(args.prm_num_envs, max(args.num_envs)), args.seconds, args.prm_checkpoint,
                                  args.num_threads, console)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(result, f, indent=2)
    return result


def images_bench(args: BenchArgs) -> dict:
    """VecEnv steps/s with obs_mode state and state+rgb (two 64x64 cameras), measured alternately (state, images,
    state, images) so that machine load hits both; frames/s = env steps/s x cameras."""
    import rlrobot

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
    import rlrobot
    from rlrobot.configs import preset
    from rlrobot.runners.off_policy import OffPolicyRunner

    cfg = preset(args.task, "sac")
    cfg.logger, cfg.out, cfg.total_steps = "none", "/tmp/rlrobot-bench-sac", 10**9
    cfg.control_mode, cfg.num_threads, cfg.torch_threads = args.control_mode, args.num_threads, args.torch_threads
    n = cfg.num_envs
    env = rlrobot.make(cfg.task, n, seed=0, control_mode=args.control_mode, num_threads=args.num_threads or None)
    env.reset(seed=0)
    raw = _rate(env.raw_step, n, min(args.seconds, args.sac_seconds))
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
