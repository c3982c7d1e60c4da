"""``rlrobot bench --backend mjwarp``: a native task on MuJoCo Warp vs the native CPU backend, in one run.

At each batch size, on the same task and control mode:
(a) native raw physics: ``mj_step`` x frame_skip on every MjData through the thread pool (the baseline);
(b) Warp raw physics: ``mujoco_warp.step`` x frame_skip on all worlds (one CUDA graph on a GPU), synchronised;
(c) Warp VecEnv: ``env.step`` with random actions (IK and task code on the gathered buffers, autoreset);
(d) PPO training iterations (rollout + update) on the Warp backend.
Ratios are against (a) measured in the same run. Env steps per second (one env step = frame_skip physics steps).
Warp's device follows ``--device`` (``cuda`` when a GPU is there, else Warp's CPU device, which is slow: use small
batches there).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from rich.table import Table

if TYPE_CHECKING:
    from rlrobot.commands.bench import BenchArgs

import rlrobot
from rlrobot.bench.common import console, ppo_bench_config, ppo_rate, rate, vecenv_rate


def run_mjwarp_bench(args: BenchArgs) -> dict:
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    torch.set_num_threads(args.torch_threads)
    rows = []
    for n in args.num_envs:
        native = rlrobot.make(args.task, n, seed=0, control_mode=args.control_mode,
                              num_threads=args.num_threads or None)
        native.reset(seed=0)
        native_raw = rate(native.raw_step, n, args.seconds)
        native.close()

        env = rlrobot.make(args.task, n, seed=0, backend="mjwarp", device=device, control_mode=args.control_mode)
        env.reset(seed=0)
        env.step(torch.zeros(n, env.action_dim, device=env.device))  # capture the CUDA graph outside the timing
        warp_raw = rate(env.raw_step, n, args.seconds)
        env.reset(seed=0)
        vec = vecenv_rate(env, n, args.seconds)
        env.close()
        cfg = ppo_bench_config(args.task, n, args.ppo_hidden, backend="mjwarp", device=device,
                               control_mode=args.control_mode, torch_threads=args.torch_threads)
        cfg.ppo.rollout_steps = args.ppo_steps
        ppo = ppo_rate(cfg, args.ppo_iterations)
        rows.append({"num_envs": n, "native_raw_steps_per_s": native_raw, "warp_raw_steps_per_s": warp_raw,
                     "warp_vecenv_steps_per_s": vec, "warp_ppo_steps_per_s": ppo,
                     "b_over_a": warp_raw / native_raw, "c_over_a": vec / native_raw, "d_over_a": ppo / native_raw})

    table = Table(title=f"rlrobot bench: {args.task} ({args.control_mode}) on MuJoCo Warp ({device}) vs native "
                        f"MuJoCo (CPU), env steps/s")
    for col in ("num_envs", "(a) native mj_step", "(b) Warp step", "(c) Warp VecEnv", "(d) PPO on Warp", "b/a", "c/a",
                "d/a"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(str(r["num_envs"]), f"{r['native_raw_steps_per_s']:,.0f}", f"{r['warp_raw_steps_per_s']:,.0f}",
                      f"{r['warp_vecenv_steps_per_s']:,.0f}", f"{r['warp_ppo_steps_per_s']:,.0f}",
                      f"{r['b_over_a']:.2f}", f"{r['c_over_a']:.2f}", f"{r['d_over_a']:.2f}")
    console.print(table)
    return {"backend": "mjwarp", "task": args.task, "device": device, "rows": rows}
