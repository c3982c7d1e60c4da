"""Preallocated on-device rollout storage for on-policy algorithms."""

from __future__ import annotations

from collections.abc import Iterator

import torch


@torch.no_grad()
def compute_gae(rewards: torch.Tensor, values: torch.Tensor, dones: torch.Tensor, last_values: torch.Tensor,
                gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE(lambda) over [T, N] tensors -> (advantages, returns). ``dones`` ends the recursion; time-outs were already
    bootstrapped into the rewards with V(final_obs)."""
    advantages = torch.zeros_like(values)
    advantage = torch.zeros_like(last_values)
    for t in reversed(range(len(values))):
        next_values = last_values if t == len(values) - 1 else values[t + 1]
        not_done = 1.0 - dones[t]
        delta = rewards[t] + gamma * next_values * not_done - values[t]
        advantage = delta + gamma * lam * not_done * advantage
        advantages[t] = advantage
    return advantages, advantages + values


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

    def compute_returns(self, last_values: torch.Tensor, gamma: float, lam: float) -> None:
        self.advantages, self.returns = compute_gae(self.rewards, self.values, self.dones, last_values, gamma, lam)

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


class ChunkRolloutStorage:
    """[num_steps, num_envs] chunk samples: observation, denoising chain, which steps were stochastic, old
    per-element log-probs (reduced over the chain), value, chunk reward and done."""

    def __init__(self, num_steps: int, num_envs: int, obs_shapes: dict[str, tuple[int, ...]],
                 obs_dtypes: dict[str, torch.dtype], chain_len: int, flat_dim: int, num_logged_steps: int,
                 executed_dim: int, device: torch.device):
        self.num_steps, self.num_envs, self.device = num_steps, num_envs, device
        z = lambda *shape, dtype=torch.float32: torch.zeros(num_steps, num_envs, *shape, dtype=dtype, device=device)  # noqa: E731
        self.obs = {k: z(*s, dtype=obs_dtypes[k]) for k, s in obs_shapes.items()}
        self.chains = z(chain_len, flat_dim)
        self.steps = z(num_logged_steps, dtype=torch.long)
        self.log_probs = z(executed_dim)
        self.values = z()
        self.rewards = z()
        self.dones = z()
        self.advantages = z()
        self.returns = z()
        self.step = 0

    def add(self, obs, chain, steps, log_probs, values, rewards, dones) -> None:
        t = self.step
        for k, buf in self.obs.items():
            buf[t].copy_(obs[k])
        self.chains[t].copy_(chain)
        self.steps[t].copy_(steps)
        self.log_probs[t].copy_(log_probs)
        self.values[t].copy_(values)
        self.rewards[t].copy_(rewards)
        self.dones[t].copy_(dones)
        self.step += 1

    def clear(self) -> None:
        self.step = 0

    def compute_returns(self, last_values: torch.Tensor, gamma: float, lam: float) -> None:
        self.advantages, self.returns = compute_gae(self.rewards, self.values, self.dones, last_values, gamma, lam)

    def minibatches(self, num_minibatches: int, num_epochs: int, generator: torch.Generator | None = None,
                    shuffle: bool = True) -> Iterator[dict]:
        batch = self.num_steps * self.num_envs
        size = batch // num_minibatches
        flat = lambda x: x.reshape(batch, *x.shape[2:])  # noqa: E731
        obs = {k: flat(v) for k, v in self.obs.items()}
        fields = {n: flat(getattr(self, n)) for n in ("chains", "steps", "log_probs", "values", "advantages", "returns")}
        for _ in range(num_epochs):
            perm = torch.randperm(batch, device=self.device, generator=generator) if shuffle \
                else torch.arange(batch, device=self.device)
            for i in range(num_minibatches):
                idx = perm[i * size:(i + 1) * size]
                yield {"obs": {k: v[idx] for k, v in obs.items()}, **{k: v[idx] for k, v in fields.items()}}
