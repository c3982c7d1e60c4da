"""Cal-QL (Nakamoto et al. 2023): CQL with the policy's Q-values calibrated from below by the data's Monte-Carlo
returns, the offline pre-training that fine-tunes well.

SAC-style learner (tanh-Gaussian actor, automatic entropy temperature, twin critics with Polyak targets, TD target
r + gamma (1 - terminal) min_i Q'_i(s', a' ~ pi(s')), no entropy in the backup) plus CQL(H)'s regulariser

    alpha * E_s[ T log sum_j exp(Q(s, a_j) / T) - Q(s, a_data) ]

over ``num_actions`` uniform actions (importance weight 1 / 0.5^A), policy actions at s and at s' (weight
1 / pi(a|s)); Cal-QL replaces the policy actions' Q(s, a) by max(Q(s, a), V_mu(s)) with V_mu(s) the MC return-to-go
of the data from s (``calibrated``), so the regulariser never pushes Q below the behaviour policy's value.
Defaults follow the reference code (cql alpha 5, 10 actions, temperature 1, lr 3e-4 critic / 1e-4 actor).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch
import torch.nn.functional as F

from rlrobot.algorithms.offline import OfflineAlgorithm, OfflineConfig, adam, as_float, offline_spec, soft_update
from rlrobot.algorithms.registry import register_algorithm
from rlrobot.domains import NonNegative, Positive, PositiveInt, PositiveUnit
from rlrobot.policies.sac_policy import QEnsemble, SquashedGaussianActor

if TYPE_CHECKING:
    from rlrobot.data.transitions import Transitions


@dataclass
class CalQLConfig(OfflineConfig):
    cql_alpha: NonNegative = 5.0
    """weight of the conservative regulariser"""
    num_actions: PositiveInt = 10
    """uniform and policy actions per state in the regulariser's log-sum-exp"""
    temperature: Positive = 1.0
    """temperature T of the log-sum-exp"""
    calibrated: bool = True
    """Cal-QL's floor max(Q, MC return) on the policy actions' Q-values (False: plain CQL(H))"""
    actor_lr: Positive = 1e-4
    """actor and entropy-temperature learning rate (the critics use lr)"""
    init_alpha: Positive = 1.0
    """initial entropy temperature (tuned toward -|A| from there; with sparse 0/1 rewards and a short budget a
    temperature of 1 outweighs the Q-values and keeps the actor near uniform)"""
    tau: PositiveUnit = 0.005
    """Polyak rate of the target critics"""
    critic_layer_norm: bool = False
    """LayerNorm in every critic layer (WSRL's pretraining; an --algo wsrl run adopts it with the weights)"""
    num_critics: PositiveInt = 2
    """critics in the ensemble (2: the twin critics of the reference code; WSRL pretrains a REDQ ensemble of 10)"""
    num_target_critics: PositiveInt = 2
    """size of the random critic subset whose min forms the TD target (REDQ's M; = num_critics: min over all)"""
    actor_q: Literal["min", "mean"] = "min"
    """how the actor reduces the critic ensemble: min (twin critics) or mean (REDQ ensembles, as WSRL)"""
    reward: Literal["dataset", "success"] = "dataset"
    """reward trained on: the dataset's next.reward, or next.success (the native tasks' sparse reward); a run with
    --reward-mode sparse selects success"""

    def validate(self, run) -> None:
        super().validate(run)
        if self.cql_alpha < 0:
            raise ValueError(f"cal_ql.cql_alpha must be >= 0, got {self.cql_alpha}")
        if self.num_actions < 1:
            raise ValueError(f"cal_ql.num_actions must be >= 1, got {self.num_actions}")
        if self.init_alpha <= 0:
            raise ValueError(f"cal_ql.init_alpha must be > 0, got {self.init_alpha}")
        if self.temperature <= 0 or self.actor_lr <= 0:
            raise ValueError(f"cal_ql.temperature and cal_ql.actor_lr must be > 0, got {self.temperature}, {self.actor_lr}")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"cal_ql.tau must be in (0, 1], got {self.tau}")
        if not 1 <= self.num_target_critics <= self.num_critics:
            raise ValueError(f"cal_ql.num_target_critics must be in [1, cal_ql.num_critics={self.num_critics}], got "
                             f"{self.num_target_critics}")
        if self.actor_q not in ("min", "mean"):
            raise ValueError(f"cal_ql.actor_q={self.actor_q!r} is not one of ('min', 'mean')")
        if self.reward not in REWARD_SOURCES:
            raise ValueError(f"cal_ql.reward={self.reward!r} is not one of {REWARD_SOURCES}")

    def prepare(self, run) -> None:
        super().prepare(run)
        if getattr(run, "reward_mode", "dense") == "sparse":  # the online task's sparse reward is its success flag
            self.reward = "success"


REWARD_SOURCES = ("dataset", "success")


def success_rewards(data: Transitions) -> Transitions:
    """The data with r = next.success (what a native task gives with --reward-mode sparse) and its MC returns-to-go
    recomputed with the data's gamma."""
    rewards = data.success.float()
    r = rewards.cpu().numpy().astype(np.float64)
    last = (torch.arange(len(data), device=data.device) == data.episode_end).cpu().numpy()
    returns = np.zeros(len(r))
    running = 0.0
    for i in range(len(r) - 1, -1, -1):  # once per run; a few 1e5 frames at most
        running = r[i] + (0.0 if last[i] else data.gamma * running)
        returns[i] = running
    return replace(data, rewards=rewards, mc_returns=torch.as_tensor(returns, dtype=torch.float32, device=data.device),
                   info={**data.info, "reward": "success"})


def calibrated(q_policy: torch.Tensor, mc_returns: torch.Tensor) -> torch.Tensor:
    """Cal-QL's floor: max(Q(s, a_pi), V_mu(s)); ``q_policy`` [..., B, K], ``mc_returns`` [B]."""
    return torch.maximum(q_policy, mc_returns[:, None])


def conservative_penalty(q_data: torch.Tensor, q_random: torch.Tensor, q_policy: torch.Tensor, logp_policy: torch.Tensor,
                         q_next_policy: torch.Tensor, logp_next_policy: torch.Tensor, action_dim: int, temperature: float,
                         mc_returns: torch.Tensor | None) -> torch.Tensor:
    """CQL(H)'s T logsumexp_j(Q(s, a_j) / T) - Q(s, a_data) per critic and state, [C, B]; with ``mc_returns`` the
    policy actions' Q-values (at s and s') are floored at the MC returns first (Cal-QL).

    Shapes: q_data [C, B]; q_random, q_policy, q_next_policy [C, B, K]; logp_policy, logp_next_policy [B, K]."""
    if mc_returns is not None:
        q_policy, q_next_policy = calibrated(q_policy, mc_returns), calibrated(q_next_policy, mc_returns)
    uniform_logp = action_dim * math.log(0.5)  # density of U[-1, 1]^A
    cat = torch.cat([q_random - uniform_logp, q_policy - logp_policy, q_next_policy - logp_next_policy], dim=-1)
    return temperature * torch.logsumexp(cat / temperature, dim=-1) - q_data


class CalQL(OfflineAlgorithm):
    def __init__(self, cfg: CalQLConfig, obs_dim, action_dim, data, device, generator=None):
        if data is not None and cfg.reward == "success":
            data = success_rewards(data)
        super().__init__(cfg, obs_dim, action_dim, data, device, generator)
        nets = self.networks
        nets["critic"] = QEnsemble(obs_dim, action_dim, cfg.hidden, cfg.num_critics,
                                   layer_norm=cfg.critic_layer_norm).to(self.device)
        nets["critic_target"] = copy.deepcopy(nets["critic"]).requires_grad_(False)
        nets["actor"] = SquashedGaussianActor(obs_dim, action_dim, cfg.hidden).to(self.device)
        self.log_alpha = torch.full((), math.log(cfg.init_alpha), device=self.device, requires_grad=True)
        self.target_entropy = -float(action_dim)
        self.optimizers["critic"] = adam(nets["critic"].parameters(), lr=cfg.lr)
        self.optimizers["actor"] = adam(nets["actor"].parameters(), lr=cfg.actor_lr)
        self.optimizers["alpha"] = adam([self.log_alpha], lr=cfg.actor_lr)

    def state_dict(self):
        return {**super().state_dict(), "log_alpha": self.log_alpha.detach().clone()}

    def load_state_dict(self, state) -> None:
        super().load_state_dict(state)
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])

    def _policy_actions(self, s: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """k policy actions per state: [B, k, A] and their log-probs [B, k]."""
        rep = s.repeat_interleave(k, 0)
        a, logp = self.networks["actor"].sample(rep)
        return a.view(len(s), k, -1), logp.view(len(s), k)

    def _q_many(self, critic, s: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Q of [B, K, A] actions: [C, B, K]."""
        b, k, _ = actions.shape
        return critic(s.repeat_interleave(k, 0), actions.reshape(b * k, -1)).view(-1, b, k)

    def critic_loss(self, batch, s: torch.Tensor, s_next: torch.Tensor) -> dict[str, torch.Tensor]:
        cfg, nets = self.cfg, self.networks
        with torch.no_grad():
            a_next, _ = nets["actor"].sample(s_next)
            q_next = nets["critic_target"](s_next, a_next)
            if cfg.num_target_critics < cfg.num_critics:  # REDQ: min over a random subset of the target ensemble
                q_next = q_next[torch.randperm(cfg.num_critics, generator=self.generator, device=self.device)[
                    :cfg.num_target_critics]]
            target = batch.rewards + cfg.gamma * (~batch.terminals).float() * q_next.min(0).values
        q = nets["critic"](s, batch.actions)
        td = F.mse_loss(q, target.expand_as(q)) * q.shape[0]
        k = cfg.num_actions
        with torch.no_grad():  # the regulariser trains the critics only
            a_pi, logp_pi = self._policy_actions(s, k)
            a_next_pi, logp_next_pi = self._policy_actions(s_next, k)
        a_rand = torch.rand((len(s), k, self.action_dim), generator=self.generator, device=self.device) * 2.0 - 1.0
        q_all = self._q_many(nets["critic"], s, torch.cat([a_rand, a_pi, a_next_pi], 1))
        q_rand, q_pi, q_next_pi = q_all.split(k, dim=-1)
        penalty = conservative_penalty(q, q_rand, q_pi, logp_pi, q_next_pi, logp_next_pi, self.action_dim,
                                       cfg.temperature, batch.mc_returns if cfg.calibrated else None)
        floored = (q_pi < batch.mc_returns[None, :, None]).float().mean()
        return {"td": td, "cql": cfg.cql_alpha * penalty.mean(1).sum(),
                "q": q.mean(), "floored_share": floored}

    def q_and_target(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean critic Q(s, a) and the TD target r + gamma (1 - terminal) min_i Q'_i(s', a'), a' the actor's mean
        action (the training target's sampled a' made deterministic, so the diagnostic does not jitter)."""
        nets = self.networks
        s, s_next = self.normalize(batch.obs), self.normalize(batch.next_obs)
        q = nets["critic"](s, batch.actions).mean(0)
        a_next = torch.tanh(nets["actor"](s_next)[0])
        next_q = nets["critic_target"](s_next, a_next).min(0).values
        return q, batch.rewards + self.cfg.gamma * (~batch.terminals).float() * next_q

    def update(self) -> dict[str, float]:
        cfg, nets = self.cfg, self.networks
        batch = self.sample()
        s, s_next = self.normalize(batch.obs), self.normalize(batch.next_obs)
        stats = self.critic_loss(batch, s, s_next)
        opt = self.optimizers["critic"]
        opt.zero_grad(set_to_none=True)
        (stats["td"] + stats["cql"]).backward()
        opt.step()
        # actor: max min_i Q_i(s, pi(s)) - alpha log pi, with the entropy temperature tuned to -A
        a, logp = nets["actor"].sample(s)
        alpha = self.log_alpha.exp().detach()
        q_pi = nets["critic"](s, a)
        q_pi = q_pi.min(0).values if cfg.actor_q == "min" else q_pi.mean(0)
        actor_loss = (alpha * logp - q_pi).mean()
        self.optimizers["actor"].zero_grad(set_to_none=True)
        actor_loss.backward()
        self.optimizers["actor"].step()
        alpha_loss = -(self.log_alpha * (logp.detach() + self.target_entropy)).mean()
        self.optimizers["alpha"].zero_grad(set_to_none=True)
        alpha_loss.backward()
        self.optimizers["alpha"].step()
        soft_update(nets["critic_target"], nets["critic"], cfg.tau)
        return as_float({**stats, "actor": actor_loss, "alpha": alpha, "entropy": -logp.mean()})

    def act(self, obs: dict[str, torch.Tensor], deterministic: bool = True) -> torch.Tensor:
        s = self.normalize(obs)
        if deterministic:
            mean, _ = self.networks["actor"](s)
            return torch.tanh(mean)
        return self.networks["actor"].sample(s)[0]


register_algorithm(offline_spec("cal-ql", "Cal-QL: CQL with the policy's Q-values floored at the data's Monte-Carlo "
                                "returns (offline, LeRobotDataset)", CalQLConfig, CalQL, sac_compatible=True))
