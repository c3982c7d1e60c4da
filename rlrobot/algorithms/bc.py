"""Behaviour cloning with a Gaussian MLP policy (the offline baseline; the flow-policy BC is ``sft``).

Maximises log N(a | mu(s), sigma(s)) of the dataset's actions, mu = tanh of the mean head (actions live in [-1, 1]),
log sigma clipped to [-5, 2]; acts with mu. Needs no rewards, so it also trains on deploy recordings.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from rlrobot.algorithms.offline import OfflineAlgorithm, OfflineConfig, adam, as_float, mlp, offline_spec
from rlrobot.algorithms.registry import register_algorithm
from rlrobot.domains import NonNegative

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


@dataclass
class BCConfig(OfflineConfig):
    weight_decay: NonNegative = 0.0
    """Adam weight decay"""

    def validate(self, run) -> None:
        super().validate(run)
        if self.weight_decay < 0:
            raise ValueError(f"bc.weight_decay must be >= 0, got {self.weight_decay}")


class GaussianActor(nn.Module):
    """mu(s) = tanh(head), sigma(s) from a second head; shared by BC and IQL's advantage-weighted actor."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: tuple[int, ...]):
        super().__init__()
        self.net = mlp(obs_dim, hidden, 2 * action_dim)
        self.action_dim = action_dim

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, log_std = self.net(x).split(self.action_dim, dim=-1)
        return torch.tanh(mean), log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)

    def log_prob(self, x: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        mean, log_std = self(x)
        return torch.distributions.Normal(mean, log_std.exp()).log_prob(actions).sum(-1)

    def act(self, x: torch.Tensor, deterministic: bool, generator: torch.Generator | None = None) -> torch.Tensor:
        mean, log_std = self(x)
        if deterministic:
            return mean
        noise = torch.randn(mean.shape, generator=generator, device=mean.device)
        return (mean + log_std.exp() * noise).clamp(-1.0, 1.0)


class BC(OfflineAlgorithm):
    def __init__(self, cfg: BCConfig, obs_dim, action_dim, data, device, generator=None):
        super().__init__(cfg, obs_dim, action_dim, data, device, generator)
        self.networks["actor"] = GaussianActor(obs_dim, action_dim, cfg.hidden).to(self.device)
        self.optimizers["actor"] = adam(self.networks["actor"].parameters(), lr=cfg.lr,
                                                    weight_decay=cfg.weight_decay)

    def update(self) -> dict[str, float]:
        batch = self.sample()
        log_prob = self.networks["actor"].log_prob(self.normalize(batch.obs), batch.actions)
        loss = -log_prob.mean()
        opt = self.optimizers["actor"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return as_float({"bc_nll": loss})

    def act(self, obs: dict[str, torch.Tensor], deterministic: bool = True) -> torch.Tensor:
        return self.networks["actor"].act(self.normalize(obs), deterministic, None)


register_algorithm(offline_spec("bc", "behaviour cloning of a Gaussian MLP policy on a LeRobotDataset (offline baseline)",
                                BCConfig, BC, needs_rewards=False))
