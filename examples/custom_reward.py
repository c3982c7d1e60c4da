"""A reward wrapper of your own: a penalty on how much the action changes from one step to the next (smoother
motions, closer to what real servos can follow), registered so that ``--reward.shaping action-rate`` selects it.

    python examples/custom_reward.py [--total-steps 200000] [--smoke]

A wrapper adds to (or replaces) the task's reward and keeps the VecEnv contract: ``info["final_obs"]`` untouched,
``info["episode"]["return"]`` the wrapped return with the task's kept as ``task_return``, and its own state in
``get_state`` / ``set_state`` so that ``--resume`` stays exact. Evaluation always reports the task's own reward.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
import torch

import rlrobot
from rlrobot.cli import main as rlrobot_cli
from rlrobot.rewards import register_reward


class ActionRatePenalty:
    """reward - weight * ||a_t - a_{t-1}||^2 (0 on an episode's first step)."""

    def __init__(self, env, weight: float = 0.05):
        self.env, self.weight = env, weight
        self.previous = torch.zeros(env.num_envs, env.single_action_space.shape[0], device=env.device)
        self.first = torch.ones(env.num_envs, dtype=torch.bool, device=env.device)
        self.returns = torch.zeros(env.num_envs, device=env.device)

    def __getattr__(self, name: str) -> Any:  # everything else is the wrapped env's
        return getattr(self.env, name)

    def reset(self, seed: int | None = None):
        self.first[:] = True
        self.returns.zero_()
        return self.env.reset(seed=seed)

    def step(self, action: torch.Tensor):
        obs, reward, terminated, truncated, info = self.env.step(action)
        penalty = self.weight * (action - self.previous).square().sum(-1) * (~self.first).float()
        reward = reward - penalty
        self.returns += reward
        self.previous, self.first = action.clone(), torch.zeros_like(self.first)
        done = terminated | truncated
        if done.any():  # the finished episodes' statistics carry the wrapped return; the next step starts afresh
            ids = info["episode"]["env_ids"]
            info["episode"] = {**info["episode"], "task_return": info["episode"]["return"], "return": self.returns[ids].clone()}
            self.returns[done], self.first[done] = 0.0, True
        return obs, reward, terminated, truncated, info

    def get_state(self) -> dict[str, Any]:
        state = self.env.get_state()
        arrays = {**state["arrays"], "action_rate.previous": self.previous.cpu().numpy(),
                  "action_rate.first": self.first.cpu().numpy(), "action_rate.returns": self.returns.cpu().numpy()}
        return {**state, "arrays": arrays}

    def set_state(self, state: dict[str, Any]) -> None:
        arrays = dict(state["arrays"])
        device = self.env.device
        self.previous = torch.as_tensor(np.asarray(arrays.pop("action_rate.previous")), device=device).clone()
        self.first = torch.as_tensor(np.asarray(arrays.pop("action_rate.first")), device=device).clone()
        self.returns = torch.as_tensor(np.asarray(arrays.pop("action_rate.returns")), device=device).clone()
        self.env.set_state({**state, "arrays": arrays})


# make_factory(gamma=...) -> (env -> wrapped env); gamma is the learner's discount (unused by this penalty)
register_reward("action-rate", lambda gamma: (lambda env: ActionRatePenalty(env, weight=0.05)))


def compare_one_episode() -> None:
    """The same random actions with and without the wrapper: the wrapped return is lower by the penalty."""
    for wrappers in ([], [lambda env: ActionRatePenalty(env)]):
        env = rlrobot.make("so101-reach", num_envs=4, seed=0, reward_wrappers=wrappers)
        env.reset(seed=0)
        gen = torch.Generator().manual_seed(0)
        for _ in range(env.max_episode_steps):
            obs, reward, terminated, truncated, info = env.step(torch.rand(4, 5, generator=gen) * 2 - 1)
        ep = info["episode"]
        print(f"{'wrapped' if wrappers else 'plain  '}: return {ep['return'].mean().item():7.2f}, "
              f"task return {ep.get('task_return', ep['return']).mean().item():7.2f}")
        env.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/example-action-rate")
    parser.add_argument("--total-steps", type=int, default=200_000)
    parser.add_argument("--smoke", action="store_true", help="a tiny run (seconds), for the tests")
    args = parser.parse_args()
    compare_one_episode()
    small = ["--num-envs", "32", "--eval-episodes", "4", "--logger", "none"] if args.smoke else []
    rlrobot_cli(["train", "--task", "so101-reach", "--reward.shaping", "action-rate", "--out", args.out, "--no-video",
                 "--total-steps", str(1_536 if args.smoke else args.total_steps), *small])
