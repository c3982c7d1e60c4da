"""PPO, RSL-RL-grade and readable top to bottom (ALGORITHMS.md has the formulas and defaults).

Clipped surrogate and value loss, entropy bonus, GAE, gradient clipping, minibatches x epochs, and RSL-RL's
adaptive learning rate driven by the KL between the rollout policy and the current one. Timeouts are bootstrapped
with V(final_obs) by the runner, which has the true final observation thanks to same-step autoreset.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from rlrobot.data.rollout_storage import RolloutStorage
from rlrobot.policies.actor_critic import ActorCritic

LR_SCHEDULES = ("adaptive", "fixed")


@dataclass
class PPOConfig:
    num_steps: int = 24  # rollout length per env per iteration
    num_epochs: int = 5
    num_minibatches: int = 4
    clip: float = 0.2
    value_clip: float = 0.2
    gamma: float = 0.99
    lam: float = 0.95
    value_coef: float = 1.0
    entropy_coef: float = 0.01
    lr: float = 1e-3
    lr_schedule: str = "adaptive"
    desired_kl: float = 0.01
    lr_min: float = 1e-5
    lr_max: float = 1e-2
    max_grad_norm: float = 1.0
    normalize_advantages: bool = True

    def __post_init__(self):
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"lr_schedule={self.lr_schedule!r} is not one of {LR_SCHEDULES}")
        for name in ("num_steps", "num_epochs", "num_minibatches"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


class PPO:
    def __init__(self, policy: ActorCritic, cfg: PPOConfig, device: torch.device, sync=None):
        self.policy, self.cfg, self.device = policy, cfg, device
        self.sync = sync  # data-parallel reductions (rlrobot.runners.distributed); None in one process
        self.optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
        self.lr = cfg.lr

    @torch.no_grad()
    def act(self, obs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample actions; returns (action, log_prob, value, mean, std)."""
        x = self.policy.features(obs)
        dist = self.policy.distribution(x)
        action = dist.sample()
        value = self.policy.critic(x).squeeze(-1)
        return action, dist.log_prob(action).sum(-1), value, dist.mean, dist.stddev

    def update(self, storage: RolloutStorage, generator: torch.Generator | None = None) -> dict[str, float]:
        cfg = self.cfg
        stats = {"policy_loss": 0.0, "value_loss": 0.0, "entropy": 0.0, "kl": 0.0, "clip_fraction": 0.0}
        n = 0
        advantages = storage.advantages
        if cfg.normalize_advantages:
            mean, std = self.sync.global_mean_std(advantages) if self.sync else (advantages.mean(), advantages.std())
            storage.advantages = (advantages - mean) / (std + 1e-8)
        for mb in storage.minibatches(cfg.num_minibatches, cfg.num_epochs, generator):
            x = self.policy.features(mb["obs"])
            dist = self.policy.distribution(x)
            log_prob = dist.log_prob(mb["actions"]).sum(-1)
            entropy = dist.entropy().sum(-1).mean()
            value = self.policy.critic(x).squeeze(-1)

            # KL(old || new) of diagonal Gaussians drives the adaptive learning rate (RSL-RL)
            with torch.no_grad():
                old_mu, old_sigma = mb["action_mean"], mb["action_std"]
                kl = (torch.log(dist.stddev / old_sigma) + (old_sigma.square() + (old_mu - dist.mean).square())
                      / (2.0 * dist.stddev.square()) - 0.5).sum(-1).mean()
                kl = self._reduce_mean(kl)
                if cfg.lr_schedule == "adaptive":
                    if kl > 2.0 * cfg.desired_kl:
                        self.lr = max(cfg.lr_min, self.lr / 1.5)
                    elif 0.0 < kl < cfg.desired_kl / 2.0:
                        self.lr = min(cfg.lr_max, self.lr * 1.5)
                    for group in self.optimizer.param_groups:
                        group["lr"] = self.lr

            ratio = torch.exp(log_prob - mb["log_probs"])
            adv = mb["advantages"]
            surrogate = torch.max(-adv * ratio, -adv * ratio.clamp(1.0 - cfg.clip, 1.0 + cfg.clip)).mean()
            value_clipped = mb["values"] + (value - mb["values"]).clamp(-cfg.value_clip, cfg.value_clip)
            value_loss = torch.max((value - mb["returns"]).square(), (value_clipped - mb["returns"]).square()).mean()
            loss = surrogate + cfg.value_coef * value_loss - cfg.entropy_coef * entropy

            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self._reduce_gradients()
            nn.utils.clip_grad_norm_(self.policy.parameters(), cfg.max_grad_norm)
            self.optimizer.step()

            stats["policy_loss"] += surrogate.item()
            stats["value_loss"] += value_loss.item()
            stats["entropy"] += entropy.item()
            stats["kl"] += float(kl)
            stats["clip_fraction"] += ((ratio - 1.0).abs() > cfg.clip).float().mean().item()
            n += 1
        out = {k: v / n for k, v in stats.items()}
        out["lr"] = self.lr
        out["action_std"] = self.policy.log_std.exp().mean().item()
        return out

    # data-parallel training: statistics averaged and gradients all-reduced across ranks
    def _reduce_mean(self, x: torch.Tensor) -> torch.Tensor:
        return self.sync.mean(x) if self.sync else x

    def _reduce_gradients(self) -> None:
        if self.sync:
            self.sync.gradients(self.policy.parameters())
