"""Offline RL on your own data: write episodes you have (here: arrays from a noisy controller, standing in for a
robot's logs) as a LeRobotDataset, then train IQL on it without ever stepping the environment during training.

    python examples/offline_own_dataset.py [--episodes 200] [--gradient-steps 3000] [--smoke]

What the offline loader needs: ``observation.state`` and ``action`` (the task's normalised action space), and for RL
``next.reward`` plus the episode ends (``next.terminated`` / ``next.truncated``; ``next.done`` alone also works).
``next.observation.state`` (s' of every frame) is optional: without it s' is the next frame, and the loader reports
how many time-outs it bootstrapped from an approximation. ``meta/rlrobot.json`` (task, control mode) is optional too;
``rlrobot collect`` writes it, and then a dataset of another task is refused by name.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import numpy as np
import torch

import rlrobot
from rlrobot.cli import main as rlrobot_cli
from rlrobot.data.lerobot_dataset import LeRobotDatasetWriter, read_lerobot_dataset


def record_your_data(out: Path, episodes: int, noise: float = 0.3, seed: int = 0) -> None:
    """Episodes of so101-reach from its scripted controller plus Gaussian noise: replace this with your own logs."""
    env = rlrobot.make("so101-reach", num_envs=1, seed=seed)
    state_dim, action_dim = env.single_observation_space["state"].shape[0], env.single_action_space.shape[0]
    vec = lambda n, dtype="float32": {"dtype": dtype, "shape": [n], "names": None}  # noqa: E731
    features = {"observation.state": vec(state_dim), "action": vec(action_dim), "next.observation.state": vec(state_dim),
                "next.reward": vec(1), "next.done": vec(1, "bool"), "next.success": vec(1, "bool"),
                "next.terminated": vec(1, "bool"), "next.truncated": vec(1, "bool")}
    writer = LeRobotDatasetWriter(out, fps=25, features=features, robot_type="so101_follower")
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    for _ in range(episodes):
        while True:
            action = np.clip(env.expert_action().numpy() + noise * rng.standard_normal(action_dim), -1, 1).astype(np.float32)
            next_obs, reward, terminated, truncated, info = env.step(torch.as_tensor(action))
            done = bool(terminated[0] or truncated[0])
            final = info["final_obs"]["state"][0] if done else next_obs["state"][0]  # s', not the next episode's start
            writer.add_frame({"observation.state": obs["state"][0].numpy(), "action": action[0],
                              "next.observation.state": final.numpy(), "next.reward": np.float32(reward[0]),
                              "next.done": done, "next.success": bool(info["success"][0]),
                              "next.terminated": bool(terminated[0]), "next.truncated": bool(truncated[0])},
                             task=env.instruction[0])
            obs = next_obs
            if done:
                writer.save_episode()
                break
    env.close()
    data = read_lerobot_dataset(out)
    print(f"wrote {out}: {len(data['episodes'])} episodes, {data['info']['total_frames']} frames")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="data/example-own-reach")
    parser.add_argument("--out", default="runs/example-iql-own")
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--gradient-steps", type=int, default=3000)
    parser.add_argument("--smoke", action="store_true", help="a tiny run (seconds), for the tests")
    args = parser.parse_args()
    data = Path(args.data)
    shutil.rmtree(data, ignore_errors=True)  # the writer refuses a non-empty directory
    record_your_data(data, 4 if args.smoke else args.episodes)
    steps = 40 if args.smoke else args.gradient_steps
    rlrobot_cli(["train", "--algo", "iql", "--task", "so101-reach", "--dataset", str(data), "--out", args.out,
                 "--iql.gradient-steps", str(steps), "--iql.updates-per-iteration", str(steps // 4), "--no-video",
                 *(["--eval-episodes", "4", "--eval-every", "0", "--logger", "none"] if args.smoke else [])])
