"""Efficient diffusion policies (EDP; Kang, Ma, Du, Pang & Yan, NeurIPS 2023; reference code sail-sg/edp), offline on
state observations.

A diffusion actor trained without running its sampling chain. The policy is a DDPM noise predictor
eps_theta(s, x_k, k) over K discrete steps (linear beta schedule, alpha_bar_k = prod_{j<=k} (1 - beta_j)):

- Diffusion loss: a_k = sqrt(alpha_bar_k) a + sqrt(1 - alpha_bar_k) eps, k ~ U{0..K-1},
      L_diff = E || eps_theta(s, a_k, k) - eps ||^2                               (mean over action dims)
- Action approximation (EDP's contribution): the same corrupted action gives the policy's action in one network call,
      a_hat = clip((a_k - sqrt(1 - alpha_bar_k) eps_theta(s, a_k, k)) / sqrt(alpha_bar_k), -1, 1)
  which stands in for a sample of the K-step chain in the RL loss (Diffusion-QL backpropagates through the chain).
- ``objective=iql`` (the paper's main pairing): IQL's expectile value and TD critics; the policy's log-likelihood is
  approximated as log N(a | a_hat, I) (``fixed_std``), so the actor loss is
      L_pi = L_diff - E[ min(exp(beta (min_i Q'_i(s, a) - V(s))), 100) log N(a | a_hat, I) ]
- ``objective=td3``: twin critics by TD to r + gamma (1 - terminal) min_i Q'_i(s', a'), a' sampled from the EMA policy
  with the fast sampler; the actor loss is L_diff - alpha Q_i(s, a_hat) / E|Q_i| (stop-gradient) with i drawn at
  random per step.
- Sampling (evaluation, and TD3's target actions): a DPM-Solver over ``sampler_steps`` of the K steps, evenly
  spaced in log-SNR (``sampler_order`` 2: multistep DPM-Solver++(2M) on the data prediction, clipped to [-1, 1];
  1: DDIM), instead of the K-step ancestral chain. Acting draws ``act_samples`` actions per state and picks one with probability
  softmax(min_i Q_i) (the reference's "ensemble" action selection, its evaluation default).

Matched with the paper and sail-sg/edp (``diffusion/dql.py``, ``nets.py``, ``trainer.py``): eps prediction, the
linear schedule (betas scale * [1e-4, 0.02], scale = 1000 / K), K = 1000 with the DPM-Solver (the reference's setting
for ``--sample_method=dpm``; 100 for its DDPM sampler) and 15 solver steps, the sinusoidal time embedding of size 16
through a 32-wide MLP, Mish activations, the clipped x_0 prediction, the IQL objective's order (value step, then actor
with the new V, then critics with the new V; targets from the Polyak critics, tau 0.005), expectile 0.7, AWR
temperature 3 with weights capped at 100, the Gaussian N(a | a_hat, I) likelihood (``fixed_std``), TD3's alpha 2
normalised by E|Q|, the EMA target policy (every 5 steps after 1,000 steps, rate tau), 50 candidate actions with a
softmax-of-Q pick, lr 3e-4, batch 256.

Changed: the solver is multistep DPM-Solver++(2M) on the discrete schedule's own time points, evenly spaced in log-SNR
(the reference runs its singlestep third-order DPM-Solver, time-uniform, on a continuous interpolation of the
schedule). On a Gaussian N(0.2, 0.1^2), whose exact noise predictor is known, 10 log-SNR steps of 2M map the noise to
within 0.002 of the exact ODE solution, where 15 time-uniform steps miss by 0.01 and first order by 0.04; the
reference's optional learned-std head (``policy_dist``, unused with ``fixed_std``) and CRR objective are left out; one
Adam for all networks (the reference keeps one per network: the losses touch disjoint parameters, so this is the same
update); ``hidden`` sizes the actor and the critics alike (reference: 3 x 256 actor, 2 x 256 critics).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
import torch.nn.functional as F
from torch import nn

from rlrobot.algorithms.offline import (
    PROBE_SEED,
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
from rlrobot.domains import NonNegative, OpenUnitInterval, PositiveInt, PositiveUnit
from rlrobot.policies.sac_policy import QEnsemble

if TYPE_CHECKING:
    from rlrobot.data.transitions import Transitions

OBJECTIVES = ("iql", "td3")
ACT_PICKS = ("softmax", "argmax")
MAX_WEIGHT = 100.0
POLICY_TARGET_EVERY, POLICY_TARGET_START = 5, 1000
"""TD3: the EMA policy that makes the target actions moves every 5 updates, from update 1,000 on (the reference's)"""


# ---------------------------------------------------------------------------------------------- the diffusion
class VPSchedule(nn.Module):
    """The discrete variance-preserving schedule: linear betas scale * [1e-4, 0.02], scale = 1000 / K (DDPM's, any K).

    Buffers (saved with the weights, so a checkpoint samples with its own schedule): ``alpha`` = sqrt(alpha_bar_k),
    ``sigma`` = sqrt(1 - alpha_bar_k), ``lam`` = log(alpha / sigma), k = 0 .. K-1 (k = 0 is nearly clean)."""

    def __init__(self, steps: int):
        super().__init__()
        scale = 1000.0 / steps
        betas = torch.linspace(scale * 1e-4, scale * 0.02, steps, dtype=torch.float64).clamp(max=0.999)
        alpha_bar = torch.cumprod(1.0 - betas, 0)
        self.steps = steps
        self.register_buffer("alpha", alpha_bar.sqrt().float())
        self.register_buffer("sigma", (1.0 - alpha_bar).sqrt().float())
        self.register_buffer("lam", (alpha_bar.sqrt() / (1.0 - alpha_bar).sqrt()).log().float())

    def corrupt(self, action: torch.Tensor, k: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """q(a_k | a): sqrt(alpha_bar_k) a + sqrt(1 - alpha_bar_k) eps."""
        return self.alpha[k, None] * action + self.sigma[k, None] * noise

    def predict_action(self, x: torch.Tensor, k: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
        """The x_0 prediction (x_k - sqrt(1 - alpha_bar_k) eps) / sqrt(alpha_bar_k), clipped to the action bounds."""
        return ((x - self.sigma[k, None] * eps) / self.alpha[k, None]).clamp(-1.0, 1.0)


def sinusoidal_embedding(k: torch.Tensor, dim: int, max_period: float = 10_000.0) -> torch.Tensor:
    """[cos(k f_j), sin(k f_j)], f_j = max_period^(-j / (dim / 2)): [B, dim] (dim even)."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, device=k.device, dtype=torch.float32) / half)
    args = k.float()[:, None] * freqs[None, :]
    return torch.cat([torch.cos(args), torch.sin(args)], -1)


class NoisePredictor(nn.Module):
    """eps_theta(s, x_k, k): an MLP (Mish) on the state, the noisy action and an embedding of k (sinusoidal features
    through a 2 x dim -> dim MLP, as the reference's ``TimeEmbedding``)."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: tuple[int, ...], time_dim: int = 16):
        super().__init__()
        self.time_dim = time_dim
        self.time = nn.Sequential(nn.Linear(time_dim, 2 * time_dim), nn.Mish(), nn.Linear(2 * time_dim, time_dim))
        self.net = mlp(obs_dim + action_dim + time_dim, hidden, action_dim, activation=nn.Mish)

    def forward(self, s: torch.Tensor, x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([s, x, self.time(sinusoidal_embedding(k, self.time_dim))], -1))


def solver_grid(schedule: VPSchedule, solver_steps: int) -> torch.Tensor:
    """The solver's time points: K - 1 down to 0 at about evenly spaced log-SNR lambda_k (DPM-Solver's ``logSNR``
    skip type), rounded to the schedule's integer steps and kept distinct: at most ``solver_steps`` + 1 points."""
    lam = schedule.lam
    targets = torch.linspace(float(lam[-1]), float(lam[0]), solver_steps + 1, device=lam.device)
    idx = torch.searchsorted(-lam, -targets).clamp(max=schedule.steps - 1)  # lambda falls with k
    return torch.unique(idx, sorted=True).flip(0)


@torch.no_grad()
def dpm_solver_sample(eps_fn, schedule: VPSchedule, s: torch.Tensor, noise: torch.Tensor, solver_steps: int,
                      order: int = 2) -> torch.Tensor:
    """A sample from the reverse diffusion by DPM-Solver++ on the data prediction x0 = clip((x - sigma eps) / alpha):

        x_{i+1} = (sigma_{i+1} / sigma_i) x_i - alpha_{i+1} (e^{-h_i} - 1) D_i,   h_i = lambda_{i+1} - lambda_i

    with D_i = x0_i (order 1: DDIM) or, from the second step on, D_i = (1 + 1/(2 r)) x0_i - 1/(2 r) x0_{i-1},
    r = h_{i-1} / h_i (order 2: the multistep 2M solver). ``eps_fn(s, x, k)``; ``noise`` [B, A] is x at k = K - 1.
    Returns the action at k = 0, clipped to [-1, 1]."""
    grid = solver_grid(schedule, solver_steps)
    x, previous, h_previous = noise, None, None
    for i in range(len(grid) - 1):
        k, k_next = grid[i], grid[i + 1]
        ks = k.expand(x.shape[0])
        x0 = schedule.predict_action(x, ks, eps_fn(s, x, ks))
        h = schedule.lam[k_next] - schedule.lam[k]
        if order == 2 and previous is not None:
            r = h_previous / h
            d = (1.0 + 0.5 / r) * x0 - (0.5 / r) * previous
        else:
            d = x0
        x = (schedule.sigma[k_next] / schedule.sigma[k]) * x - schedule.alpha[k_next] * torch.expm1(-h) * d
        previous, h_previous = x0, h
    return x.clamp(-1.0, 1.0)


# ---------------------------------------------------------------------------------------------- the algorithm
@dataclass
class EDPConfig(OfflineConfig):
    objective: Literal["iql", "td3"] = "iql"
    """the RL objective the diffusion actor is trained with: iql (advantage-weighted likelihood, the paper's main
    pairing, no sampling in training) or td3 (Q of the approximated action; target actions sampled by the solver)"""
    diffusion_steps: PositiveInt = 1000
    """K: steps of the diffusion (the reference with its DPM-Solver: 1000)"""
    sampler_steps: PositiveInt = 15
    """DPM-Solver steps of a sample (evaluation, TD3's targets); the reference: 15"""
    sampler_order: Literal[1, 2] = 2
    """2: multistep DPM-Solver++(2M); 1: DDIM (first order)"""
    act_samples: PositiveInt = 50
    """candidate actions per state at evaluation, one picked as act_pick says (1: the sample itself)"""
    act_pick: Literal["softmax", "argmax"] = "softmax"
    """softmax: a candidate drawn with probability softmax(min_i Q_i) (the reference); argmax: the candidate of the
    highest min_i Q_i (a near-deterministic policy where Q differs little between candidates)"""
    expectile: OpenUnitInterval = 0.7
    """iql: tau of the value's expectile regression"""
    beta: NonNegative = 3.0
    """iql: inverse temperature of the advantage weights (the reference's awr_temperature)"""
    td3_alpha: NonNegative = 2.0
    """td3: weight of the Q term, divided by E|Q| (the reference's alpha)"""
    tau: PositiveUnit = 0.005
    """Polyak rate of the target critics (and of td3's EMA policy)"""
    time_dim: PositiveInt = 16
    """size of the diffusion-step embedding"""
    critic_layer_norm: bool = False
    """LayerNorm in the critics and the value"""

    def validate(self, run) -> None:
        super().validate(run)
        if self.objective not in OBJECTIVES:
            raise ValueError(f"edp.objective={self.objective!r} is not one of {OBJECTIVES}")
        for field in ("diffusion_steps", "sampler_steps", "act_samples", "time_dim"):
            if getattr(self, field) < 1:
                raise ValueError(f"edp.{field} must be >= 1, got {getattr(self, field)}")
        if self.time_dim % 2:
            raise ValueError(f"edp.time_dim must be even (cos and sin features), got {self.time_dim}")
        if self.act_pick not in ACT_PICKS:
            raise ValueError(f"edp.act_pick={self.act_pick!r} is not one of {ACT_PICKS}")
        if self.sampler_order not in (1, 2):
            raise ValueError(f"edp.sampler_order must be 1 or 2, got {self.sampler_order}")
        if not 0.0 < self.expectile < 1.0:
            raise ValueError(f"edp.expectile must be in (0, 1), got {self.expectile}")
        if self.beta < 0 or self.td3_alpha < 0:
            raise ValueError(f"edp.beta and edp.td3_alpha must be >= 0, got {self.beta} and {self.td3_alpha}")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"edp.tau must be in (0, 1], got {self.tau}")


class EDP(OfflineAlgorithm):
    """Networks: ``actor`` eps_theta, ``schedule`` (buffers), ``critic`` (2 members), ``critic_target``, and ``value``
    (iql) or ``actor_target`` (td3)."""

    def __init__(self, cfg: EDPConfig, obs_dim: int, action_dim: int, data: Transitions | None,
                 device: torch.device | str, generator: torch.Generator | None = None):
        super().__init__(cfg, obs_dim, action_dim, data, device, generator)
        nets = self.networks
        nets["schedule"] = VPSchedule(cfg.diffusion_steps).to(self.device)
        nets["actor"] = NoisePredictor(obs_dim, action_dim, tuple(cfg.hidden), cfg.time_dim).to(self.device)
        nets["critic"] = QEnsemble(obs_dim, action_dim, cfg.hidden, 2, layer_norm=cfg.critic_layer_norm).to(self.device)
        nets["critic_target"] = copy.deepcopy(nets["critic"]).requires_grad_(False)
        params = [*nets["actor"].parameters(), *nets["critic"].parameters()]
        if cfg.objective == "iql":
            nets["value"] = mlp(obs_dim, cfg.hidden, 1, layer_norm=cfg.critic_layer_norm).to(self.device)
            params += list(nets["value"].parameters())
        else:
            nets["actor_target"] = copy.deepcopy(nets["actor"]).requires_grad_(False)
        self.optimizers["all"] = adam(params, lr=cfg.lr)

    @property
    def schedule(self) -> VPSchedule:
        return self.networks["schedule"]

    # ------------------------------------------------------------------ the diffusion actor
    def diffusion_terms(self, s: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(L_diff, a_hat): the eps-prediction loss at one random step k per sample and the action approximated from
        the same corrupted action (one network call; a_hat carries the actor's gradient)."""
        n = actions.shape[0]
        k = torch.randint(self.schedule.steps, (n,), generator=self.generator, device=self.device)
        noise = torch.randn(actions.shape, generator=self.generator, device=self.device)
        x = self.schedule.corrupt(actions, k, noise)
        eps = self.networks["actor"](s, x, k)
        return (eps - noise).square().mean(), self.schedule.predict_action(x, k, eps)

    def sample_actions(self, s: torch.Tensor, actor: nn.Module | None = None,
                       generator: torch.Generator | None = None) -> torch.Tensor:
        """Actions from the reverse diffusion by the DPM-Solver: [B, A] in [-1, 1]."""
        noise = torch.randn((s.shape[0], self.action_dim), generator=generator, device=s.device)
        return dpm_solver_sample(actor or self.networks["actor"], self.schedule, s, noise, self.cfg.sampler_steps,
                                 self.cfg.sampler_order)

    # ------------------------------------------------------------------ the objectives
    def iql_losses(self, batch: Transitions, s: torch.Tensor, s_next: torch.Tensor) -> dict[str, torch.Tensor]:
        cfg, nets = self.cfg, self.networks
        with torch.no_grad():
            q_target = nets["critic_target"](s, batch.actions).min(0).values
        v = nets["value"](s).squeeze(-1)
        value_loss = expectile_loss(q_target - v, cfg.expectile)
        with torch.no_grad():  # one joint step: the weights and the TD target use V before this step's update
            v_now = v.detach()  # (the reference steps V first and uses the new V: one step of lag here)
            next_v = nets["value"](s_next).squeeze(-1)
            td_target = batch.rewards + cfg.gamma * (~batch.terminals).float() * next_v
            weights = torch.exp(cfg.beta * (q_target - v_now)).clamp(max=MAX_WEIGHT)
        q = nets["critic"](s, batch.actions)
        critic_loss = F.mse_loss(q, td_target.expand_as(q)) * q.shape[0]
        diffusion_loss, a_hat = self.diffusion_terms(s, batch.actions)
        log_prob = -0.5 * (batch.actions - a_hat).square().sum(-1) - 0.5 * self.action_dim * math.log(2 * math.pi)
        guide_loss = -(weights * log_prob).mean()
        return {"value": value_loss, "critic": critic_loss, "diffusion": diffusion_loss, "guide": guide_loss,
                "actor": diffusion_loss + guide_loss, "q": q.mean(), "v": v.mean(), "weight": weights.mean()}

    def td3_losses(self, batch: Transitions, s: torch.Tensor, s_next: torch.Tensor) -> dict[str, torch.Tensor]:
        cfg, nets = self.cfg, self.networks
        with torch.no_grad():
            a_next = self.sample_actions(s_next, nets["actor_target"], self.generator)
            next_q = nets["critic_target"](s_next, a_next).min(0).values
            td_target = batch.rewards + cfg.gamma * (~batch.terminals).float() * next_q
        q = nets["critic"](s, batch.actions)
        critic_loss = F.mse_loss(q, td_target.expand_as(q)) * q.shape[0]
        diffusion_loss, a_hat = self.diffusion_terms(s, batch.actions)
        member = int(torch.randint(2, (1,), generator=self.generator, device=self.device))
        nets["critic"].requires_grad_(False)
        q_hat = nets["critic"](s, a_hat)[member]
        nets["critic"].requires_grad_(True)
        guide_loss = -cfg.td3_alpha * q_hat.mean() / q_hat.detach().abs().mean().clamp_min(1e-6)
        return {"critic": critic_loss, "diffusion": diffusion_loss, "guide": guide_loss,
                "actor": diffusion_loss + guide_loss, "q": q.mean()}

    def q_and_target(self, batch: Transitions) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean critic Q(s, a) and the TD target: r + gamma (1 - terminal) V(s') (iql), or min_i Q'_i(s', a') with a'
        from the target actor's solver on noise of a generator of its own, seeded afresh (td3: the same a' every call)."""
        nets = self.networks
        s, s_next = self.normalize(batch.obs), self.normalize(batch.next_obs)
        if self.cfg.objective == "iql":
            next_value = nets["value"](s_next).squeeze(-1)
        else:
            probe = torch.Generator(device=self.device).manual_seed(PROBE_SEED)
            next_value = nets["critic_target"](s_next, self.sample_actions(s_next, nets["actor_target"], probe)).min(0).values
        return nets["critic"](s, batch.actions).mean(0), batch.rewards + self.cfg.gamma * (~batch.terminals).float() * next_value

    def update(self) -> dict[str, float]:
        cfg, nets = self.cfg, self.networks
        batch = self.sample()
        s, s_next = self.normalize(batch.obs), self.normalize(batch.next_obs)
        stats = self.iql_losses(batch, s, s_next) if cfg.objective == "iql" else self.td3_losses(batch, s, s_next)
        total = stats["critic"] + stats["actor"] + stats.get("value", 0.0)
        opt = self.optimizers["all"]
        opt.zero_grad(set_to_none=True)
        total.backward()  # disjoint parameters: targets, weights and V in the critic's target are constants
        opt.step()
        soft_update(nets["critic_target"], nets["critic"], cfg.tau)
        if cfg.objective == "td3" and self.updates + 1 > POLICY_TARGET_START and (self.updates + 1) % POLICY_TARGET_EVERY == 0:
            soft_update(nets["actor_target"], nets["actor"], cfg.tau)
        return as_float(stats)

    # ------------------------------------------------------------------ acting
    @torch.no_grad()
    def act(self, obs: dict[str, torch.Tensor], deterministic: bool = True) -> torch.Tensor:
        """``act_samples`` solver samples per state, one picked with probability softmax(min_i Q_i(s, a)) or the best
        (``act_pick``); the draws come from torch's global RNG, which evaluation seeds inside a fork: a stochastic
        policy whatever ``deterministic`` says, as the reference evaluates."""
        s = self.normalize({k: v.to(self.device) for k, v in obs.items()})
        n, m = s.shape[0], self.cfg.act_samples
        if m == 1:
            return self.sample_actions(s)
        s_rep = s.repeat_interleave(m, 0)
        candidates = self.sample_actions(s_rep)
        q = self.networks["critic"](s_rep, candidates).min(0).values.view(n, m)
        pick = q.argmax(-1) if self.cfg.act_pick == "argmax" else torch.multinomial(torch.softmax(q, -1), 1).squeeze(-1)
        return candidates.view(n, m, -1)[torch.arange(n, device=s.device), pick]


register_algorithm(offline_spec("edp", "efficient diffusion policy: a DDPM actor trained from one corrupted action (action "
                                "approximation) with IQL or TD3, DPM-Solver sampling (offline)", EDPConfig, EDP))
