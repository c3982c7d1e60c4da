"""Preallocated on-device rollout storage for on-policy algorithms."""

from __future__ import annotations

from collections.abc import Iterator

import torch


class RolloutStorage:
    def __init__(self, num_steps: int, num_envs: int, obs_shapes: dict[str, tuple[int, ...]], action_dim: int,
                 device: torch.device, obs_dtypes: dict[str, torch.dtype] | None = None):
        self.num_steps, self.num_envs, self.device = num_steps, num_envs, device
        dtypes = obs_dtypes or {}
        self.obs = {k: torch.zeros(num_steps, num_envs, *s, dtype=dtypes.get(k, torch.float32), device=device)
                    for k, s in obs_shapes.items()}
        z = lambda *shape: torch.zeros(num_steps, num_envs, *shape, device=device)  # noqa: E731
        self.actions = z(action_dim)
        self.log_probs = z()
        self.values = z()
        self.rewards = z()
        self.dones = z()
        self.action_mean = z(action_dim)
        self.action_std = z(action_dim)
        self.advantages = z()
        self.returns = z()
        self.step = 0

    def add(self, obs: dict[str, torch.Tensor], actions, log_probs, values, rewards, dones, mean, std) -> None:
        if self.step >= self.num_steps:
            raise RuntimeError("rollout storage is full; call clear() after the update")
        t = self.step
        for k, buf in self.obs.items():
            buf[t].copy_(obs[k])
        self.actions[t].copy_(actions)
        self.log_probs[t].copy_(log_probs)
        self.values[t].copy_(values)
        self.rewards[t].copy_(rewards)
        self.dones[t].copy_(dones)
        self.action_mean[t].copy_(mean)
        self.action_std[t].copy_(std)
        self.step += 1

    def clear(self) -> None:
        self.step = 0

    @torch.no_grad()
    def compute_returns(self, last_values: torch.Tensor, gamma: float, lam: float) -> None:
        """GAE(lambda). ``dones`` ends the recursion; truncations were already bootstrapped into the rewards."""
        advantage = torch.zeros_like(last_values)
        for t in reversed(range(self.num_steps)):
            next_values = last_values if t == self.num_steps - 1 else self.values[t + 1]
            not_done = 1.0 - self.dones[t]
            delta = self.rewards[t] + gamma * next_values * not_done - self.values[t]
            advantage = delta + gamma * lam * not_done * advantage
            self.advantages[t] = advantage
        self.returns = self.advantages + self.values

    def minibatches(self, num_minibatches: int, num_epochs: int, generator: torch.Generator | None = None
                    ) -> Iterator[dict[str, torch.Tensor | dict[str, torch.Tensor]]]:
        batch = self.num_steps * self.num_envs
        size = batch // num_minibatches
        flat = lambda x: x.reshape(batch, *x.shape[2:])  # noqa: E731
        obs = {k: flat(v) for k, v in self.obs.items()}
        fields = {name: flat(getattr(self, name)) for name in
                  ("actions", "log_probs", "values", "advantages", "returns", "action_mean", "action_std")}
        for _ in range(num_epochs):
            perm = torch.randperm(batch, device=self.device, generator=generator)
            for i in range(num_minibatches):
                idx = perm[i * size:(i + 1) * size]
                yield {"obs": {k: v[idx] for k, v in obs.items()}, **{k: v[idx] for k, v in fields.items()}}
