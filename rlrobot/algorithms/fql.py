"""Flow Q-learning (FQL; Park, Li & Levine 2025, reference code seohongpark/fql), offline on state observations.

Flow time f in [0, 1] runs from noise (f = 0) to action (f = 1), the FQL / RQL papers' convention (openpi's t = 1 - f;
our networks never meet openpi's, so no conversion is needed). z ~ N(0, I) is the noise, a the data action.

- BC flow policy v_theta(s, x^f, f), trained by flow matching:
      L_BC(theta) = E_{s,a ~ D, z, f ~ U(0,1)} || v_theta(s, (1 - f) z + f a, f) - (a - z) ||^2
- ODE_theta(s, z): F Euler steps x <- x + v_theta(s, x, i / F) / F (i = 0 .. F-1) from x = z, clipped to [-1, 1].
- One-step policy mu_omega(s, z), which acts: distilled from the flow and pushed up the critic,
      L_pi(omega) = alpha E || mu_omega(s, z) - ODE_theta(s, z) ||^2 - lambda E mean_j Q_phi_j(s, clip(mu_omega(s, z)))
  with lambda = ``q_weight`` (1; 0 makes mu_omega a pure distillation of the flow), divided by E|Q| (stop-gradient)
  with ``normalize_q_loss``. Only mu_omega gets the Q gradient; the flow is pure BC (the ODE target carries no
  gradient). Both actor losses and the critic loss are summed into one step from the same parameters, as the
  reference (they touch disjoint parameters, so Adam makes this the same as separate steps).
- Critics Q_phi_1, Q_phi_2 (LayerNorm MLPs), TD to the Polyak-averaged targets phi-bar (rate tau):
      L_Q(phi) = E ( Q_phi_j(s, a) - y )^2,  y = r + gamma (1 - terminal) agg_j Q_phi-bar_j(s', clip(mu_omega(s', z')))
  agg = mean (the reference default) or min; a time-out bootstraps (only a termination cuts the return).
- Acting: a = clip(mu_omega(s, z)), z ~ N(0, I), as the reference evaluates (``act_noise="zero"`` feeds z = 0: a
  deterministic policy). The draws come from torch's global RNG, which evaluation seeds inside a fork, so they never
  touch the training stream.

Reference defaults: lr 3e-4, batch 256, 4 x 512 MLPs (critics with LayerNorm, actors without), tau 0.005, F = 10,
alpha 10 (300 on OGBench cube / scene), q_agg mean. Here ``hidden`` sizes all four networks (CPU presets: 2 x 256).
The networks, flow integration and the small losses live here as functions on tensors (unit-tested on their own);
``rql.py`` reuses the networks and the flow integration.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from rlrobot.algorithms.offline import OfflineAlgorithm, OfflineConfig, as_float, offline_spec, soft_update
from rlrobot.algorithms.registry import register_algorithm
from rlrobot.domains import NonNegative, PositiveInt, PositiveUnit

VelocityFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""v(obs_features [B, D], x [B, A], f [B, 1]) -> velocity [B, A]"""


# ---------------------------------------------------------------------------------------------- networks
class EnsembleMLP(nn.Module):
    """E independent MLPs evaluated in one batched matmul per layer: ``[B, in]`` or ``[E, B, in]`` -> ``[E, B, out]``.

    Each hidden layer is Linear -> GELU (-> LayerNorm), as the reference's MLP; Xavier-uniform weights (flax's
    variance_scaling(1, fan_avg, uniform)), zero biases. E = 1 is a plain MLP (``MLP`` squeezes that axis)."""

    def __init__(self, in_dim: int, hidden: tuple[int, ...], out_dim: int, members: int = 1, layer_norm: bool = False):
        super().__init__()
        self.members, self.layer_norm = members, layer_norm
        dims = (in_dim, *hidden, out_dim)
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        self.norm_weights = nn.ParameterList()
        self.norm_biases = nn.ParameterList()
        for i, (d_in, d_out) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
            bound = math.sqrt(6.0 / (d_in + d_out))
            self.weights.append(nn.Parameter(torch.empty(members, d_in, d_out).uniform_(-bound, bound)))
            self.biases.append(nn.Parameter(torch.zeros(members, 1, d_out)))
            if layer_norm and i < len(hidden):
                self.norm_weights.append(nn.Parameter(torch.ones(members, 1, d_out)))
                self.norm_biases.append(nn.Parameter(torch.zeros(members, 1, d_out)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:
            x = x.unsqueeze(0).expand(self.members, -1, -1)
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            x = torch.baddbmm(b, x, w)
            if i < last:
                x = F.gelu(x)
                if self.layer_norm:
                    x = F.layer_norm(x, x.shape[-1:]) * self.norm_weights[i] + self.norm_biases[i]
        return x


class MLP(EnsembleMLP):
    """One MLP (``EnsembleMLP`` with one member): ``[B, in]`` -> ``[B, out]``."""

    def __init__(self, in_dim: int, hidden: tuple[int, ...], out_dim: int, layer_norm: bool = False):
        super().__init__(in_dim, hidden, out_dim, 1, layer_norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x).squeeze(0)


class VectorField(nn.Module):
    """v(s, x^f, f): the flow's velocity (also the one-step policy mu(s, z) without the time input)."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: tuple[int, ...], time_input: bool = True,
                 layer_norm: bool = False):
        super().__init__()
        self.time_input = time_input
        self.net = MLP(obs_dim + action_dim + int(time_input), hidden, action_dim, layer_norm)

    def forward(self, obs: torch.Tensor, x: torch.Tensor, f: torch.Tensor | None = None) -> torch.Tensor:
        return self.net(torch.cat([obs, x, f], -1) if self.time_input else torch.cat([obs, x], -1))


class Critic(nn.Module):
    """An ensemble Q_j(s, a) (or V_j(s, x^f, f): the partial action and flow time are its 'action'): ``[E, B]``."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: tuple[int, ...], members: int, layer_norm: bool = True):
        super().__init__()
        self.net = EnsembleMLP(obs_dim + action_dim, hidden, 1, members, layer_norm)

    def forward(self, obs: torch.Tensor, *action_inputs: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([obs, *action_inputs], -1)).squeeze(-1)


# ---------------------------------------------------------------------------------------------- the math
def interpolate(noise: torch.Tensor, action: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """x^f = (1 - f) z + f a (f = 0 noise, f = 1 action); the flow-matching target velocity is a - z."""
    return (1.0 - f) * noise + f * action


def flow_matching_loss(velocity: VelocityFn, obs: torch.Tensor, action: torch.Tensor, noise: torch.Tensor,
                       f: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """E || v(s, x^f, f) - (a - z) ||^2, averaged over batch and action dims; ``mask`` [B, A] drops padded entries
    (chunks running past an episode's end) from the average (the reference keeps them in the denominator)."""
    error = (velocity(obs, interpolate(noise, action, f), f) - (action - noise)).square()
    if mask is None:
        return error.mean()
    return (error * mask).sum() / mask.numel()


def integrate_flow(velocity: VelocityFn, obs: torch.Tensor, noise: torch.Tensor, steps: int,
                   clip: bool = True) -> torch.Tensor:
    """ODE(s, z): Euler from f = 0 (noise) to f = 1 (action), x <- x + v(s, x, i / F) / F."""
    x = noise
    for i in range(steps):
        x = x + velocity(obs, x, noise.new_full((noise.shape[0], 1), i / steps)) / steps
    return x.clamp(-1.0, 1.0) if clip else x


def aggregate(values: torch.Tensor, how: str = "mean", rho: float = 0.0) -> torch.Tensor:
    """Reduce an ensemble [E, B] to [B]: ``min``, or ``mean`` - rho * std (population std, as jnp.std; rho = 0: mean)."""
    if how == "min":
        return values.min(0).values
    if how != "mean":
        raise ValueError(f"ensemble aggregation {how!r} is not one of ('mean', 'min')")
    if rho == 0.0:
        return values.mean(0)
    return values.mean(0) - rho * values.std(0, unbiased=False)


def td_target(rewards: torch.Tensor, terminals: torch.Tensor, gamma: float, next_value: torch.Tensor) -> torch.Tensor:
    """One-step y = r + gamma (1 - terminal) V(s'); time-outs are not terminals, so they bootstrap."""
    return rewards + gamma * (~terminals).to(rewards.dtype) * next_value


# ---------------------------------------------------------------------------------------------- the algorithm
Q_AGGREGATIONS = ("mean", "min")
ACT_NOISE = ("sampled", "zero")


@dataclass
class FQLConfig(OfflineConfig):
    alpha: NonNegative = 10.0
    """distillation weight (the BC strength; reference 10, 300 on OGBench cube / scene)"""
    flow_steps: PositiveInt = 10
    """Euler steps F of the BC flow (the distillation target)"""
    tau: PositiveUnit = 0.005
    """Polyak rate of the target critics"""
    q_agg: Literal["mean", "min"] = "mean"
    """how the TD target reduces the two target critics (reference: mean)"""
    normalize_q_loss: bool = False
    """scale the actor's Q term by 1 / E|Q| (stop-gradient), making alpha independent of the reward scale"""
    q_weight: NonNegative = 1.0
    """weight of the actor's Q term (0 = the one-step policy is a pure distillation of the BC flow: an ablation)"""
    act_noise: Literal["sampled", "zero"] = "sampled"
    """the noise z the policy acts from in evaluation and deployment: sampled z ~ N(0, I), as the reference evaluates
    (every reported figure), or zero (a deterministic policy)"""

    def validate(self, run) -> None:
        super().validate(run)
        name = run.spec.config_field
        if self.alpha < 0 or self.q_weight < 0:
            raise ValueError(f"{name}.alpha and {name}.q_weight must be >= 0, got {self.alpha} and {self.q_weight}")
        if self.flow_steps < 1:
            raise ValueError(f"{name}.flow_steps must be >= 1, got {self.flow_steps}")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"{name}.tau must be in (0, 1], got {self.tau}")
        if self.q_agg not in Q_AGGREGATIONS:
            raise ValueError(f"{name}.q_agg={self.q_agg!r} is not one of {Q_AGGREGATIONS}")
        if self.act_noise not in ACT_NOISE:
            raise ValueError(f"{name}.act_noise={self.act_noise!r} is not one of {ACT_NOISE}")


class FQL(OfflineAlgorithm):
    """Networks: ``bc_flow`` v_theta, ``onestep`` mu_omega, ``critic`` Q_phi (2 members), ``target_critic``."""

    def __init__(self, cfg: FQLConfig, obs_dim: int, action_dim: int, data, device, generator=None):
        super().__init__(cfg, obs_dim, action_dim, data, device, generator)
        hidden = tuple(cfg.hidden)
        self.networks["bc_flow"] = VectorField(obs_dim, action_dim, hidden).to(self.device)
        self.networks["onestep"] = VectorField(obs_dim, action_dim, hidden, time_input=False).to(self.device)
        self.networks["critic"] = Critic(obs_dim, action_dim, hidden, members=2).to(self.device)
        self.networks["target_critic"] = copy.deepcopy(self.networks["critic"]).requires_grad_(False)
        actor = [*self.networks["bc_flow"].parameters(), *self.networks["onestep"].parameters()]
        self.optimizers = {"actor": torch.optim.Adam(actor, lr=cfg.lr, **fused_adam(self.device)),
                           "critic": torch.optim.Adam(self.networks["critic"].parameters(), lr=cfg.lr, **fused_adam(self.device))}

    def noise(self, n: int) -> torch.Tensor:
        return torch.randn(n, self.action_dim, generator=self.generator, device=self.device)

    def onestep_actions(self, s: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return self.networks["onestep"](s, z).clamp(-1.0, 1.0)

    def flow_actions(self, s: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """ODE_theta(s, z): the BC flow's action for noise z (the distillation target)."""
        return integrate_flow(self.networks["bc_flow"], s, z, self.cfg.flow_steps)

    def q_and_target(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean critic Q(s, a) and the TD target r + gamma (1 - terminal) agg_j Qbar_j(s', mu(s', 0)): the training
        target with the one-step policy's noise at zero (the diagnostic does not jitter with the draw)."""
        nets = self.networks
        s, s_next = self.normalize(batch.obs), self.normalize(batch.next_obs)
        a_next = self.onestep_actions(s_next, torch.zeros(len(s_next), self.action_dim, device=self.device))
        next_q = aggregate(nets["target_critic"](s_next, a_next), self.cfg.q_agg)
        return nets["critic"](s, batch.actions).mean(0), td_target(batch.rewards, batch.terminals, self.cfg.gamma, next_q)

    def update(self) -> dict[str, float]:
        cfg, nets = self.cfg, self.networks
        batch = self.sample()
        s, s_next, a = self.normalize(batch.obs), self.normalize(batch.next_obs), batch.actions
        n = a.shape[0]

        # ---- critics: y = r + gamma (1 - terminal) agg_j Qbar_j(s', clip(mu(s', z')))
        with torch.no_grad():
            next_q = aggregate(nets["target_critic"](s_next, self.onestep_actions(s_next, self.noise(n))), cfg.q_agg)
            target = td_target(batch.rewards, batch.terminals, cfg.gamma, next_q)
        q = nets["critic"](s, a)
        critic_loss = (q - target).square().mean()

        # ---- actor: flow BC + alpha distillation - Q(s, mu(s, z)); the critics get no gradient from it
        bc_loss = flow_matching_loss(nets["bc_flow"], s, a, self.noise(n),
                                     torch.rand(n, 1, generator=self.generator, device=self.device))
        z = self.noise(n)
        with torch.no_grad():
            flow_target = self.flow_actions(s, z)
        mu = nets["onestep"](s, z)
        distill_loss = (mu - flow_target).square().mean()
        nets["critic"].requires_grad_(False)
        q_pi = nets["critic"](s, mu.clamp(-1.0, 1.0)).mean(0)
        nets["critic"].requires_grad_(True)
        q_loss = -q_pi.mean()
        if cfg.normalize_q_loss:
            q_loss = q_loss / q_pi.detach().abs().mean().clamp_min(1e-6)
        actor_loss = bc_loss + cfg.alpha * distill_loss + cfg.q_weight * q_loss

        # one joint step from the same parameters, as the reference (the two losses touch disjoint parameters)
        for opt in self.optimizers.values():
            opt.zero_grad(set_to_none=True)
        (critic_loss + actor_loss).backward()
        for opt in self.optimizers.values():
            opt.step()
        soft_update(nets["target_critic"], nets["critic"], cfg.tau)
        return as_float({"critic_loss": critic_loss, "actor_loss": actor_loss, "bc_flow_loss": bc_loss,
                         "distill_loss": distill_loss, "q_loss": q_loss, "q_mean": q.detach().mean()})

    @torch.no_grad()
    def act(self, obs: dict[str, torch.Tensor], deterministic: bool = True) -> torch.Tensor:
        """mu_omega(s, z) with z as ``act_noise`` says (the policy is stochastic by construction whatever ``deterministic``)."""
        s = self.normalize({k: v.to(self.device) for k, v in obs.items()})
        return self.onestep_actions(s, acting_noise(self.cfg.act_noise, s.shape[0], self.action_dim, self.device))


def acting_noise(kind: str, n: int, dim: int, device: torch.device) -> torch.Tensor:
    """The noise a flow policy acts from: z ~ N(0, I) from torch's global RNG (evaluation seeds it inside a fork), or 0."""
    return torch.zeros(n, dim, device=device) if kind == "zero" else torch.randn(n, dim, device=device)


def fused_adam(device: torch.device) -> dict[str, bool]:
    """Fused Adam (one kernel for all parameters) where torch has it: a large share of a small update on the CPU."""
    return {"fused": True} if device.type in ("cpu", "cuda") else {}


register_algorithm(offline_spec("fql", "flow Q-learning: a one-step policy distilled from a BC flow against Q (offline)",
                                FQLConfig, FQL))
