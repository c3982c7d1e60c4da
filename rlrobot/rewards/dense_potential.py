"""Potential-based reward shaping (Ng, Harada & Russell 1999): r' = r + gamma Phi(s') - Phi(s), with Phi(terminal) = 0.

It leaves the optimal policy unchanged while giving a sparse reward a dense gradient. Phi here is the task's own dense
reward evaluated at a state, so ``--reward-mode sparse --reward.shaping dense-potential`` learns the sparse task with
the dense reward's guidance. Over an episode the shaped discounted return differs from the sparse one only by the
boundary terms gamma^T Phi(s_T) (0 when the episode terminated) - Phi(s_0).

The env must expose ``potential()`` (Phi of its current states) and ``info["next_potential"]`` (Phi of each env's
state after the step, before any autoreset); the native tasks do.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlrobot.rewards.discount import ChunkDiscount
from rlrobot.rewards.registry import RewardSpec, register_reward


class PotentialShaping(ChunkDiscount):
    """The env's reward plus gamma Phi(s') - Phi(s), Phi the task's dense reward (0 at a terminal state)."""

    def __init__(self, env: Any, gamma: float):
        if not hasattr(env, "potential"):
            raise ValueError(f"{type(env).__name__} provides no potential(): dense-potential shaping needs a native task")
        self.env, self.gamma = env, float(gamma)
        self.phi = torch.zeros(env.num_envs, device=env.device)
        self.shaped_return = torch.zeros(env.num_envs, device=env.device)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    def reset(self, seed: int | None = None):
        obs, info = self.env.reset(seed=seed)
        self.phi = self.env.potential().clone()
        self.shaped_return.zero_()
        return obs, info

    def step(self, action: torch.Tensor):
        obs, reward, terminated, truncated, info = self.env.step(action)
        next_phi = info["next_potential"]
        shaped = reward + self.step_gamma() * next_phi * (~terminated).float() - self.phi
        self.shaped_return += shaped
        done = terminated | truncated
        self.phi = next_phi.clone()
        if done.any():
            ids = info["episode"]["env_ids"]
            info["episode"] = {**info["episode"], "task_return": info["episode"]["return"],
                               "return": self.shaped_return[ids].clone()}
            self.shaped_return[done] = 0.0
            self.phi[done] = self.env.potential()[done]  # the new episodes' first states
        return obs, shaped, terminated, truncated, info

    # checkpoints: the potential of the current states and the running return travel with the env state
    def get_state(self) -> dict[str, Any]:
        state = self.env.get_state()
        arrays = {**state["arrays"], "shaping.phi": self.phi.cpu().numpy(),
                  "shaping.return": self.shaped_return.cpu().numpy()}
        return {**state, "arrays": arrays}

    def set_state(self, state: dict[str, Any]) -> None:
        arrays = dict(state["arrays"])
        self.phi = torch.as_tensor(np.asarray(arrays.pop("shaping.phi")), device=self.env.device).clone()
        self.shaped_return = torch.as_tensor(np.asarray(arrays.pop("shaping.return")), device=self.env.device).clone()
        self.env.set_state({**state, "arrays": arrays})


register_reward(RewardSpec(
    "dense-potential", "potential-based shaping gamma Phi(s') - Phi(s) with the task's dense reward as Phi",
    lambda gamma, settings, argument: (lambda env: PotentialShaping(env, gamma)),
    native_task="its dense reward is the potential"))
