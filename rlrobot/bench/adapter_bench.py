"""``rlrobot bench --backend maniskill``: a simulator's own vector env vs our adapter vs PPO training, in one run.

(a) the simulator's own batched step with random actions (ManiSkill: ``ManiSkillVectorEnv.step`` of each sub-env);
(b) the adapter's ``VecEnv.step`` (action scaling, observation mapping, final_obs, episode stats);
(c) PPO training iterations (rollout + update) on the adapter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from rich.table import Table

if TYPE_CHECKING:
    from rlrobot.commands.bench import BenchArgs

import rlrobot
from rlrobot.bench.common import console, ppo_bench_config, ppo_rate, rate


def run_adapter_bench(args: BenchArgs) -> dict:
    task = args.task if args.task.startswith("maniskill:") else "maniskill:PushCube-v1"
    torch.set_num_threads(args.torch_threads)
    rows = []
    for n in args.num_envs:
        env = rlrobot.make(task, n, seed=0)
        env.reset(seed=0)
        gen = torch.Generator().manual_seed(0)
        raw_actions = [torch.rand(sub.num_envs, env.action_dim, generator=gen) * 2 - 1 for sub in env._subs]

        def raw_step(env=env, raw_actions=raw_actions):
            for sub, action in zip(env._subs, raw_actions, strict=True):
                sub.step(action.to(sub.device))

        raw = rate(raw_step, n, args.seconds)
        env.reset(seed=0)
        actions = torch.rand(n, env.action_dim, generator=gen) * 2 - 1
        vec = rate(lambda env=env, actions=actions: env.step(actions), n, args.seconds)
        env.close()
        cfg = ppo_bench_config(task, n, args.ppo_hidden, torch_threads=args.torch_threads)
        cfg.ppo.rollout_steps = args.ppo_steps
        ppo = ppo_rate(cfg, args.ppo_iterations)
        rows.append({"num_envs": n, "sim_steps_per_s": raw, "vecenv_steps_per_s": vec, "ppo_steps_per_s": ppo,
                     "b_over_a": vec / raw, "c_over_a": ppo / raw})
    table = Table(title=f"rlrobot bench: {task} ({env.sim_backend} sim), env steps/s")
    for col in ("num_envs", "(a) ManiSkill vector env", "(b) VecEnv adapter", "(c) PPO train", "b/a", "c/a"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(str(r["num_envs"]), f"{r['sim_steps_per_s']:,.0f}", f"{r['vecenv_steps_per_s']:,.0f}",
                      f"{r['ppo_steps_per_s']:,.0f}", f"{r['b_over_a']:.2f}", f"{r['c_over_a']:.2f}")
    console.print(table)
    return {"backend": "maniskill", "task": task, "rows": rows}
