"""Reversal Q-learning (RQL; reference code aoberai/rql, built on FQL's), offline on state observations.

Flow time f in [0, 1] runs from noise (f = 0) to action (f = 1), as in FQL (``fql.py``). The actor is a flow over
action chunks A = (a_t, ..., a_{t+h-1}) (flattened, h |A| numbers); each flow step is an action of an expanded MDP
whose state is (s, x^f, f), so one value function V_phi(s, x^f, f) covers the state, the partial action and the flow
time. V is an ensemble of E LayerNorm MLPs (E = 10), V-bar its Polyak average (rate tau).

- Reversed flows make partial actions that are compatible with the data: draw a depth d per sample (half d ~ U(0, 1),
  half from the grid {0, 1/F, ..., 1}); from the data chunk x = A at f = 1 take F Euler steps of size d / F backwards
  with the current actor, no gradient:  x <- x - v_theta(s, x, f) d / F,  f <- f - d / F,  ending at f = 1 - d.
- h-step target, the same for every depth (k = steps of the window inside the episode, k = h unless it ended):
      y = sum_{i<k} gamma^i r_{t+i} + gamma^k (1 - terminal) [mean_j V-bar_j(s_{t+k}, z', 0) - rho std_j V-bar_j(...)]
  z' ~ N(0, I): the value of s_{t+k} before any flow step. A time-out inside the window bootstraps with gamma^k.
- Critic: expectile regression, L_V(phi) = E_j E |kappa - 1(y - V_j(s, x^f, f) < 0)| (y - V_j(s, x^f, f))^2.
- Actor: flow-matching BC plus a one-step look-ahead through the value (no backprop through the whole chain),
      L_pi(theta) = alpha L_BC(theta) - E mean_j V_j(s, x^f + v_theta(s, x^f, f) min(1/F, 1 - f), min(f + 1/F, 1))
  with x^f = (1 - f) z + f A, f ~ U(0, 1) shared by both terms; padded actions past an episode's end are masked out
  of L_BC. Only theta gets the actor gradient.
- Acting: an EMA copy of the actor (decay beta = 0.999) integrates F = 10 Euler steps from z ~ N(0, I), as the
  reference evaluates (``act_noise="zero"``: z = 0); the h actions of the chunk run open-loop, then the actor re-plans.

Reference defaults: h 3, alpha 1, kappa 0.5, rho 0, E 10, 4 x 512 MLPs, lr 3e-4, batch 256, tau 0.005, beta 0.999,
F 10, gamma 0.99; manipulation (OGBench cube / scene / puzzle): h 5, rho 0.5, kappa 0.7-0.9, alpha 1-10.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Annotated, Literal

import torch

from rlrobot.algorithms.fql import (
    ACT_NOISE,
    Critic,
    VectorField,
    VelocityFn,
    acting_noise,
    aggregate,
    fused_adam,
    integrate_flow,
    interpolate,
)
from rlrobot.algorithms.offline import (
    OfflineAlgorithm,
    OfflineConfig,
    as_float,
    expectile_loss,
    offline_spec,
    soft_update,
)
from rlrobot.algorithms.registry import register_algorithm
from rlrobot.domains import Domain, NonNegative, OpenUnitInterval, PositiveInt, PositiveUnit


# ---------------------------------------------------------------------------------------------- the math
def sample_depth(batch: int, steps: int, generator: torch.Generator, device: torch.device | str = "cpu") -> torch.Tensor:
    """Reversal depths d [B]: the first half ~ U(0, 1), the rest uniform on the grid {0, 1/F, ..., 1}."""
    uniform = torch.rand(batch // 2, generator=generator, device=device)
    grid = torch.randint(0, steps + 1, (batch - batch // 2,), generator=generator, device=device) / steps
    return torch.cat([uniform, grid])


@torch.no_grad()
def reverse_flow(velocity: VelocityFn, obs: torch.Tensor, action: torch.Tensor, depth: torch.Tensor,
                 steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the flow backwards from the data action (f = 1) by ``depth`` d [B] in F Euler steps of d / F:
    returns (x^f [B, A], f [B, 1]) with f = 1 - d. No gradient (the reference stops it)."""
    step = (depth / steps).unsqueeze(-1)
    x, f = action, torch.ones_like(step)
    for _ in range(steps):
        x = x - velocity(obs, x, f) * step
        f = f - step
    return x, f


def lookahead(x: torch.Tensor, velocity: torch.Tensor, f: torch.Tensor, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One Euler step forward, not past f = 1: (x + v min(1/F, 1 - f), min(f + 1/F, 1))."""
    return x + velocity * torch.clamp(1.0 - f, max=1.0 / steps), torch.clamp(f + 1.0 / steps, max=1.0)


def h_step_target(rewards: torch.Tensor, valid: torch.Tensor, terminals: torch.Tensor, discount_h: torch.Tensor,
                  next_value: torch.Tensor, gamma: float) -> torch.Tensor:
    """y = sum_{i<h} gamma^i r_i valid_i + discount_h (1 - terminal) V(s_{t+k}).

    rewards, valid [B, h]; terminals, discount_h (gamma^k, k valid steps), next_value [B]. A window cut by a time-out
    bootstraps from the state where it was cut with gamma^k; one cut by a termination does not bootstrap."""
    powers = gamma ** torch.arange(rewards.shape[1], device=rewards.device, dtype=rewards.dtype)
    returns = (rewards * valid.to(rewards.dtype) * powers).sum(1)
    return returns + discount_h * (~terminals).to(rewards.dtype) * next_value


# ---------------------------------------------------------------------------------------------- the algorithm
@dataclass
class RQLConfig(OfflineConfig):
    horizon: PositiveInt = 3
    """h: actions per chunk (the actor's output and the critic's h-step target; reference 3, manipulation 5)"""
    alpha: NonNegative = 1.0
    """weight of the flow-matching BC loss in the actor loss (reference 1, manipulation 1-10)"""
    expectile: OpenUnitInterval = 0.5
    """kappa of the critic's expectile regression (0.5 = least squares; manipulation 0.7-0.9)"""
    rho: NonNegative = 0.0
    """ensemble pessimism: the target is mean - rho * std over the target values (manipulation 0.5)"""
    num_values: PositiveInt = 10
    """ensemble size E of V(s, x^f, f)"""
    flow_steps: PositiveInt = 10
    """Euler steps F of the flow (acting and reversal)"""
    tau: PositiveUnit = 0.005
    """Polyak rate of the target values"""
    ema: Annotated[float, Domain(0.0, 1.0, high_open=True)] = 0.999
    """decay of the EMA actor that acts"""
    act_noise: Literal["sampled", "zero"] = "sampled"
    """the noise z the policy acts from in evaluation and deployment: sampled z ~ N(0, I), as the reference evaluates
    (every reported figure), or zero (a deterministic policy)"""

    def validate(self, run) -> None:
        super().validate(run)
        name = run.spec.config_field
        for field in ("horizon", "num_values", "flow_steps"):
            if getattr(self, field) < 1:
                raise ValueError(f"{name}.{field} must be >= 1, got {getattr(self, field)}")
        if not 0.0 < self.expectile < 1.0:
            raise ValueError(f"{name}.expectile must be in (0, 1), got {self.expectile}")
        if self.alpha < 0 or self.rho < 0:
            raise ValueError(f"{name}.alpha and {name}.rho must be >= 0, got {self.alpha} and {self.rho}")
        if self.rho > 0 and self.num_values < 2:
            raise ValueError(f"{name}.rho={self.rho} needs an ensemble: {name}.num_values must be >= 2, got {self.num_values}")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"{name}.tau must be in (0, 1], got {self.tau}")
        if not 0.0 <= self.ema < 1.0:
            raise ValueError(f"{name}.ema must be in [0, 1), got {self.ema}")
        if self.act_noise not in ACT_NOISE:
            raise ValueError(f"{name}.act_noise={self.act_noise!r} is not one of {ACT_NOISE}")


class RQL(OfflineAlgorithm):
    """Networks: ``actor`` v_theta over chunks, ``ema_actor`` (acts), ``value`` V_phi (E members), ``target_value``."""

    def __init__(self, cfg: RQLConfig, obs_dim: int, action_dim: int, data, device, generator=None):
        super().__init__(cfg, obs_dim, action_dim, data, device, generator)
        self.chunk_size = cfg.horizon
        self.chunk_dim = cfg.horizon * action_dim
        hidden = tuple(cfg.hidden)
        self.networks["actor"] = VectorField(obs_dim, self.chunk_dim, hidden).to(self.device)
        self.networks["ema_actor"] = copy.deepcopy(self.networks["actor"]).requires_grad_(False)
        # V(s, x^f, f): the partial chunk and its flow time are the critic's 'action' input
        self.networks["value"] = Critic(obs_dim, self.chunk_dim + 1, hidden, members=cfg.num_values).to(self.device)
        self.networks["target_value"] = copy.deepcopy(self.networks["value"]).requires_grad_(False)
        self.optimizers = {
            "actor": torch.optim.Adam(self.networks["actor"].parameters(), lr=cfg.lr, **fused_adam(self.device)),
            "value": torch.optim.Adam(self.networks["value"].parameters(), lr=cfg.lr, **fused_adam(self.device))}

    def noise(self, n: int) -> torch.Tensor:
        return torch.randn(n, self.chunk_dim, generator=self.generator, device=self.device)

    def update(self) -> dict[str, float]:
        cfg, nets = self.cfg, self.networks
        batch = self.data.sample_chunks(cfg.batch_size, cfg.horizon, self.generator)
        s, s_next = self.normalize(batch.obs), self.normalize(batch.next_obs)
        chunk = batch.actions.flatten(1)  # [B, h A]
        n = chunk.shape[0]

        # ---- value: expectile regression of V(s, x^f, f) at reversed partial chunks onto the h-step target
        with torch.no_grad():
            next_v = nets["target_value"](s_next, self.noise(n), torch.zeros(n, 1, device=self.device))
            target = h_step_target(batch.rewards, batch.valid, batch.terminals, batch.discount_h,
                                   aggregate(next_v, "mean", cfg.rho), cfg.gamma)
            x_f, f = reverse_flow(nets["actor"], s, chunk, sample_depth(n, cfg.flow_steps, self.generator, self.device),
                                  cfg.flow_steps)
        v = nets["value"](s, x_f, f)  # [E, B]
        value_loss = expectile_loss(target - v, cfg.expectile)

        # ---- actor: alpha * flow-matching BC (padded actions masked) - V one Euler step ahead
        z = self.noise(n)
        t = torch.rand(n, 1, generator=self.generator, device=self.device)
        x_t = interpolate(z, chunk, t)
        velocity = nets["actor"](s, x_t, t)
        mask = batch.valid.repeat_interleave(self.action_dim, dim=1).to(chunk.dtype)
        bc_loss = ((velocity - (chunk - z)).square() * mask).mean()
        nets["value"].requires_grad_(False)
        v_ahead = nets["value"](s, *lookahead(x_t, velocity, t, cfg.flow_steps)).mean(0)
        nets["value"].requires_grad_(True)
        actor_loss = cfg.alpha * bc_loss - v_ahead.mean()

        # one joint step from the same parameters, as the reference (the two losses touch disjoint parameters)
        for opt in self.optimizers.values():
            opt.zero_grad(set_to_none=True)
        (value_loss + actor_loss).backward()
        for opt in self.optimizers.values():
            opt.step()
        soft_update(nets["target_value"], nets["value"], cfg.tau)
        soft_update(nets["ema_actor"], nets["actor"], 1.0 - cfg.ema)
        return as_float({"value_loss": value_loss, "actor_loss": actor_loss, "bc_loss": bc_loss,
                         "v_mean": v.detach().mean(), "v_ahead": v_ahead.detach().mean(), "target": target.mean()})

    @torch.no_grad()
    def act(self, obs: dict[str, torch.Tensor], deterministic: bool = True) -> torch.Tensor:
        """A chunk [N, h, A] from the EMA actor (F Euler steps from z as ``act_noise`` says, whatever ``deterministic``)."""
        s = self.normalize({k: v.to(self.device) for k, v in obs.items()})
        z = acting_noise(self.cfg.act_noise, s.shape[0], self.chunk_dim, self.device)
        chunk = integrate_flow(self.networks["ema_actor"], s, z, self.cfg.flow_steps)
        return chunk.view(s.shape[0], self.cfg.horizon, self.action_dim)


register_algorithm(offline_spec("rql", "reversal Q-learning: a flow actor with a value over partial actions and flow "
                                "time, reversed flows, h-step expectile targets, ensemble pessimism (offline)", RQLConfig, RQL))
