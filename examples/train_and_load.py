"""Train PPO on so101-reach from Python, then load the trained policy two ways.

    python examples/train_and_load.py [--out runs/example-reach] [--total-steps 200000] [--smoke]

1. ``LoadedPolicy``: what ``rlrobot serve`` runs; numpy observations in, an action chunk out, deterministic.
2. The policy module itself (``build_policy`` + the checkpoint's weights): batched torch inference in your own loop.
"""

from __future__ import annotations

import argparse

import torch

import rlrobot
from rlrobot.checkpoints import load_checkpoint
from rlrobot.cli import main as rlrobot_cli
from rlrobot.config import config_from_checkpoint
from rlrobot.policies.registry import build_policy
from rlrobot.real_robot.policy_runtime import LoadedPolicy


def train(out: str, total_steps: int, smoke: bool) -> None:
    """The same as `rlrobot train --task so101-reach --out OUT --total-steps N` on the command line."""
    small = ["--num-envs", "32", "--eval-episodes", "4", "--logger", "none"] if smoke else []
    rlrobot_cli(["train", "--task", "so101-reach", "--out", out, "--total-steps", str(total_steps), "--no-video", *small])


def run_loaded_policy(run: str) -> None:
    policy = LoadedPolicy(run)  # a run directory (its latest checkpoint) or one of its checkpoints/iter_NNNNNN
    print("policy metadata:", {k: policy.metadata[k] for k in ("task", "control_mode", "action_dim", "chunk_size")})
    env = rlrobot.make(policy.cfg.task, num_envs=1, seed=0, **policy.cfg.task_options())
    obs, _ = env.reset(seed=0)
    for _ in range(env.max_episode_steps):
        chunk = policy.infer({k: v.numpy() for k, v in obs.items()})  # numpy [chunk_size, action_dim]
        obs, reward, terminated, truncated, info = env.step(torch.as_tensor(chunk[:1]))
        if "episode" in info:
            print(f"LoadedPolicy: return {info['episode']['return'].item():.1f}, success {info['episode']['success'].item()}")
    env.close()


def run_batched(run: str, num_envs: int = 16) -> float:
    weights, saved, ckpt = load_checkpoint(run)  # the tensors, config.json's contents, the checkpoint directory
    cfg = config_from_checkpoint(saved)  # the run's config: task, modes, the algorithm's and the policy's sections
    policy = build_policy(saved, cfg)  # the policy kind named in config.json (an MLP actor-critic for PPO)
    policy.load_state_dict(weights)  # the observation normaliser's statistics are part of the weights
    policy.eval()
    env = rlrobot.make(cfg.task, num_envs=num_envs, seed=1, **cfg.task_options())
    obs, _ = env.reset(seed=1)
    with torch.inference_mode():
        for _ in range(env.max_episode_steps):
            obs, reward, terminated, truncated, info = env.step(policy.act(obs, deterministic=True))
    success = info["episode"]["success"].float().mean().item()
    print(f"{ckpt.name}: success over {num_envs} envs {success:.2f}")
    env.close()
    return success


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/example-reach")
    parser.add_argument("--total-steps", type=int, default=200_000)
    parser.add_argument("--smoke", action="store_true", help="a tiny run (seconds), for the tests")
    args = parser.parse_args()
    train(args.out, 1_536 if args.smoke else args.total_steps, args.smoke)
    run_loaded_policy(args.out)
    run_batched(args.out)
