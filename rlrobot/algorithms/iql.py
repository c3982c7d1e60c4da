"""Implicit Q-learning (Kostrikov et al. 2021), the offline baseline of the offline-RL table.

- V(s) by expectile regression on the target critics: L_V = E[|tau - 1(u < 0)| u^2], u = min_i Q'_i(s, a) - V(s)
  (``expectile_loss`` of ``rlrobot.algorithms.offline``, shared with RQL).
- Q_i(s, a) by TD to r + gamma (1 - terminal) V(s') (time-outs bootstrap); twin critics, Polyak targets (tau 0.005).
- Actor by advantage-weighted regression: maximise E[exp(beta (Q'(s, a) - V(s))) log pi(a | s)], weights clipped at
  100; a Gaussian MLP (``GaussianActor``, as BC) acting with its mean.

The three losses touch disjoint parameters (targets and advantages are detached), so one backward pass and one Adam
step per update serve all three. Defaults: the paper's (expectile 0.7, beta 3, 2x256, lr 3e-4, batch 256).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rlrobot.algorithms.bc import GaussianActor
from rlrobot.algorithms.offline import (
    OfflineAlgorithm,
    OfflineConfig,
    adam,
    as_float,
    expectile_loss,
    mlp,
    offline_spec,
    soft_update,
)
from rlrobot.algorithms.registry import register_algorithm
from rlrobot.domains import NonNegative, OpenUnitInterval, PositiveUnit
from rlrobot.policies.sac_policy import QEnsemble

MAX_WEIGHT = 100.0


@dataclass
class IQLConfig(OfflineConfig):
    expectile: OpenUnitInterval = 0.7
    """tau of the value's expectile regression (0.7 locomotion, 0.9 sparse antmaze)"""
    beta: NonNegative = 3.0
    """inverse temperature of the advantage weights (3 locomotion, 10 antmaze)"""
    tau: PositiveUnit = 0.005
    """Polyak rate of the target critics"""
    critic_layer_norm: bool = False
    """LayerNorm in the critics and the value"""

    def validate(self, run) -> None:
        super().validate(run)
        if not 0.0 < self.expectile < 1.0:
            raise ValueError(f"iql.expectile must be in (0, 1), got {self.expectile}")
        if self.beta < 0:
            raise ValueError(f"iql.beta must be >= 0, got {self.beta}")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"iql.tau must be in (0, 1], got {self.tau}")


class IQL(OfflineAlgorithm):
    def __init__(self, cfg: IQLConfig, obs_dim, action_dim, data, device, generator=None):
        super().__init__(cfg, obs_dim, action_dim, data, device, generator)
        nets = self.networks
        nets["critic"] = QEnsemble(obs_dim, action_dim, cfg.hidden, 2, layer_norm=cfg.critic_layer_norm).to(self.device)
        nets["critic_target"] = copy.deepcopy(nets["critic"]).requires_grad_(False)
        nets["value"] = mlp(obs_dim, cfg.hidden, 1, layer_norm=cfg.critic_layer_norm).to(self.device)
        nets["actor"] = GaussianActor(obs_dim, action_dim, cfg.hidden).to(self.device)
        params = [*nets["critic"].parameters(), *nets["value"].parameters(), *nets["actor"].parameters()]
        self.optimizers["all"] = adam(params, lr=cfg.lr)

    def losses(self, batch) -> dict[str, torch.Tensor]:
        cfg, nets = self.cfg, self.networks
        s, s_next = self.normalize(batch.obs), self.normalize(batch.next_obs)
        with torch.no_grad():
            q_target = nets["critic_target"](s, batch.actions).min(0).values
            next_v = nets["value"](s_next).squeeze(-1)
            td_target = batch.rewards + cfg.gamma * (~batch.terminals).float() * next_v
        v = nets["value"](s).squeeze(-1)
        value_loss = expectile_loss(q_target - v, cfg.expectile)
        q = nets["critic"](s, batch.actions)
        critic_loss = F.mse_loss(q, td_target.expand_as(q)) * q.shape[0]
        advantage = (q_target - v).detach()
        weights = torch.exp(cfg.beta * advantage).clamp(max=MAX_WEIGHT)
        actor_loss = -(weights * nets["actor"].log_prob(s, batch.actions)).mean()
        return {"value": value_loss, "critic": critic_loss, "actor": actor_loss, "q": q.mean(), "v": v.mean(),
                "advantage": advantage.mean(), "weight": weights.mean()}

    def q_and_target(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean critic Q(s, a) and the TD target r + gamma (1 - terminal) V(s') (the workflow's diagnostics)."""
        s, s_next = self.normalize(batch.obs), self.normalize(batch.next_obs)
        q = self.networks["critic"](s, batch.actions).mean(0)
        next_v = self.networks["value"](s_next).squeeze(-1)
        return q, batch.rewards + self.cfg.gamma * (~batch.terminals).float() * next_v

    def update(self) -> dict[str, float]:
        stats = self.losses(self.sample())
        opt = self.optimizers["all"]
        opt.zero_grad(set_to_none=True)
        (stats["value"] + stats["critic"] + stats["actor"]).backward()
        opt.step()
        soft_update(self.networks["critic_target"], self.networks["critic"], self.cfg.tau)
        return as_float(stats)

    def act(self, obs: dict[str, torch.Tensor], deterministic: bool = True) -> torch.Tensor:
        return self.networks["actor"].act(self.normalize(obs), deterministic, None)


register_algorithm(offline_spec("iql", "implicit Q-learning: expectile value, twin critics, advantage-weighted Gaussian "
                                "actor (offline, LeRobotDataset)", IQLConfig, IQL))
