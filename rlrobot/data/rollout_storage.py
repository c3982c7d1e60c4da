"""Preallocated on-device rollout storage for on-policy algorithms, described by its fields.

PPO stores per step (actions, log-probs, Gaussian mean / std, ...); flow-policy PPO stores per chunk (the denoising
chain, which steps were stochastic, per-element log-probs, ...). Both are one ``RolloutStorage`` with different
``fields``; ``values``, ``rewards`` and ``dones`` are always there for GAE, which adds ``advantages`` and ``returns``.

``mask`` (1 = a step of the learner's own, 0 = a step another policy acted, e.g. JSRL's guide) is stored beside: GAE
runs through every step (returns bootstrap through the episode), the losses and advantage normalisation of the
algorithms count only masked-in steps (``masked_mean``). Without a mask every step is the learner's.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

Shape = tuple[int, ...]


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
    """``[num_steps, num_envs]`` tensors: observations (``obs_specs``: key -> (shape, dtype)) and ``fields``
    (name -> (shape, dtype)) on ``device``."""

    GAE_FIELDS: dict[str, tuple[Shape, torch.dtype]] = {"values": ((), torch.float32), "rewards": ((), torch.float32),
                                                         "dones": ((), torch.float32)}

    def __init__(self, num_steps: int, num_envs: int, obs_specs: dict[str, tuple[Shape, torch.dtype]],
                 fields: dict[str, tuple[Shape, torch.dtype]], device: torch.device):
        self.num_steps, self.num_envs, self.device = num_steps, num_envs, device
        self.obs = {k: torch.zeros(num_steps, num_envs, *shape, dtype=dtype, device=device)
                    for k, (shape, dtype) in obs_specs.items()}
        self.fields = {**fields, **self.GAE_FIELDS}
        self.data = {name: torch.zeros(num_steps, num_envs, *shape, dtype=dtype, device=device)
                     for name, (shape, dtype) in self.fields.items()}
        self.advantages = torch.zeros(num_steps, num_envs, device=device)
        self.returns = torch.zeros(num_steps, num_envs, device=device)
        self.mask = torch.ones(num_steps, num_envs, device=device)
        self.step = 0

    def empty_like(self) -> RolloutStorage:
        """A second, empty storage of the same layout (the rollout's while the update reads this one)."""
        obs_specs = {k: (tuple(v.shape[2:]), v.dtype) for k, v in self.obs.items()}
        fields = {k: spec for k, spec in self.fields.items() if k not in self.GAE_FIELDS}
        return RolloutStorage(self.num_steps, self.num_envs, obs_specs, fields, self.device)

    def __getattr__(self, name: str) -> torch.Tensor:
        data = self.__dict__.get("data", {})
        if name in data:
            return data[name]
        raise AttributeError(name)

    def add(self, obs: dict[str, torch.Tensor], mask: torch.Tensor | None = None, **fields: torch.Tensor) -> None:
        """One step of every env; ``mask`` [num_envs] (bool or float): which envs' steps are the learner's (None: all)."""
        if self.step >= self.num_steps:
            raise RuntimeError("rollout storage is full; call clear() after the update")
        if fields.keys() != self.data.keys():
            raise KeyError(f"add() needs exactly the fields {sorted(self.data)}, got {sorted(fields)}")
        t = self.step
        for k, buf in self.obs.items():
            buf[t].copy_(obs[k])
        for name, value in fields.items():
            self.data[name][t].copy_(value)
        if mask is None:
            self.mask[t].fill_(1.0)
        else:
            self.mask[t].copy_(mask)
        self.step += 1

    def clear(self) -> None:
        self.step = 0

    def compute_returns(self, last_values: torch.Tensor, gamma: float, lam: float) -> None:
        self.advantages, self.returns = compute_gae(self.data["rewards"], self.data["values"], self.data["dones"],
                                                    last_values, gamma, lam)

    @property
    def learner_steps(self) -> int:
        return int(self.mask.sum())

    def minibatches(self, num_minibatches: int, num_epochs: int, generator: torch.Generator | None = None,
                    shuffle: bool = True, extra: dict[str, torch.Tensor] | None = None) -> Iterator[dict]:
        """``num_epochs`` passes over the rollout in ``num_minibatches`` random minibatches: ``{"obs": {...}, field:
        tensor, "advantages", "returns", "mask"}`` and the ``extra`` tensors ([num_steps, num_envs, ...]) alongside."""
        batch = self.num_steps * self.num_envs
        size = batch // num_minibatches
        flat = lambda x: x.reshape(batch, *x.shape[2:])  # noqa: E731
        obs = {k: flat(v) for k, v in self.obs.items()}
        tensors = {name: flat(v) for name, v in self.data.items() if name not in ("rewards", "dones")}
        tensors["advantages"], tensors["returns"] = flat(self.advantages), flat(self.returns)
        tensors["mask"] = flat(self.mask)
        tensors.update({name: flat(v) for name, v in (extra or {}).items()})
        for _ in range(num_epochs):
            perm = torch.randperm(batch, device=self.device, generator=generator) if shuffle \
                else torch.arange(batch, device=self.device)
            for i in range(num_minibatches):
                idx = perm[i * size:(i + 1) * size]
                yield {"obs": {k: v[idx] for k, v in obs.items()}, **{k: v[idx] for k, v in tensors.items()}}


def masked_mean(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean of ``x`` over the entries where ``mask`` is 1 (0 when none is); ``x.mean()`` without a mask. Masked-out
    entries never reach the result, even if they are not finite."""
    if mask is None:
        return x.mean()
    mask = mask.to(x.dtype).reshape(mask.shape + (1,) * (x.dim() - mask.dim()))
    mask = mask.expand_as(x)
    return torch.where(mask > 0, x, torch.zeros_like(x)).sum() / mask.sum().clamp(min=1.0)
