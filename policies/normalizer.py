"""Running mean / std observation normaliser, a module so that it is saved and exported with the policy."""

from __future__ import annotations

import torch
from torch import nn


class RunningNormalizer(nn.Module):
    def __init__(self, dim: int, clip: float = 10.0, eps: float = 1e-8):
        super().__init__()
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("var", torch.ones(dim))
        self.register_buffer("count", torch.tensor(eps, dtype=torch.float64))
        self.clip = clip
        self.eps = eps

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Parallel (Chan et al.) update with a batch; called during rollouts only."""
        x = x.reshape(-1, x.shape[-1]).to(self.mean.dtype)
        batch_mean = x.mean(0)
        batch_var = x.var(0, unbiased=False)
        n = x.shape[0]
        total = self.count + n
        delta = batch_mean - self.mean
        self.mean += delta * (n / total).to(self.mean.dtype)
        m2 = self.var * self.count.to(self.var.dtype) + batch_var * n + delta.square() * (self.count * n / total).to(self.var.dtype)
        self.var.copy_(m2 / total.to(self.var.dtype))
        self.count.copy_(total)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ((x - self.mean) / torch.sqrt(self.var + self.eps)).clamp(-self.clip, self.clip)
