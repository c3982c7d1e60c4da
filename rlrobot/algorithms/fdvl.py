"""f-DVL, dual V-learning with an f-divergence (Sikchi, Zheng, Zhang & Niekum, "Dual RL: Unification and New Methods
for Reinforcement and Imitation Learning", ICLR 2024; reference code hari-sikchi/DVL), offline on state observations.

Dual RL writes offline RL as a regularised linear program over visitation distributions; its dual over a value V
is unconstrained, and with a semi-gradient Q(s, a) ~ r + gamma V(s') the value step is an *implicit maximiser*: V(s)
regresses onto the data's Q(s, a) with the convex conjugate f*_p of the chosen f-divergence, which weighs Q above V
more than Q below it, so V settles near the best of the data's actions without querying any other action.
XQL's Gumbel regression is the reverse-KL member of the family (the conjugate of KL is exponential, whose gradients
blow up for large Q - V: XQL's instability); f-DVL replaces it with the Pearson chi-square or total-variation
conjugates, whose losses grow at most quadratically.

With x = Q'(s, a) - V(s), Q' the min of the Polyak target critics, alpha the loss temperature:

- value:   chi-square      L_V = E[ alpha max(x + x^2 / 4, 0) - (1 - alpha) x ]         (the paper's choice)
           total-variation L_V = E[ alpha max(x, 0) - (1 - alpha) x ]
           reverse-KL      L_V = E[ e^(z - m) - z e^(-m) - e^(-m) ],  z = min(x / alpha, clip), m = max(max_batch z, -1)
                           (XQL's Gumbel loss scaled by e^(-m), a stop-gradient: an adaptive learning rate)
  over the data's actions and, with ``random_actions`` = n, n uniform actions per state as well (the reference's
  ``sample_random_times``: the value sees 1/2 (data + uniform), smoothing the maximiser).
- critics: twin Q_i by Huber(delta 20) regression onto r + gamma (1 - terminal) V(s') (time-outs bootstrap).
- actor:   advantage-weighted regression, max E[ min(exp(beta (Q'(s, a) - V(s))), 100) log pi(a | s) ], a Gaussian
           MLP with a tanh mean (``GaussianActor``, as IQL) acting with its mean.

Matched with hari-sikchi/DVL (``critic.py``, ``actor.py``, ``learner.py``, ``configs/mujoco_config.py``, the README's
locomotion command): the three conjugate losses as written there, chi-square the default (``--f=chi-square`` with
``--sample_random_times=1 --max_clip=5``), value from the target critics, Huber critics with delta 20,
AWR with beta 3 capped at 100, LayerNorm in the value network, tau 0.005, lr 3e-4 for all networks, a cosine decay of
the actor's learning rate over the run, gamma 0.99, 2 x 256 MLPs.

Changed: the loss temperature alpha defaults to 0.8 (the reference's antmaze command; its locomotion command runs chi-
square at 1). At alpha = 1 the chi-square loss is zero for -4 < Q - V < 0, so nothing pulls V down to the data's
Q-values: V climbs to them from below when it starts below, but stays above them when it starts above (the bandit's
negative rewards: V 0.7 above every Q, every advantage negative, the actor learns nothing); on so101-push noisy (seed
0, the preset) alpha 1 succeeded 0.59, alpha 0.8 0.84. The reference decays the actor's learning rate along a cosine
over its 1M steps; that is off by default here (``actor_cosine_decay``): over a 250-step bandit run it left the actor
at 0.31-0.46 from the best action, against 0.11-0.20 without. Batch 256 (the reference: 1024); one Adam step for the
three losses from the same batch (the reference steps V first and trains the actor and the critics with the new V:
here they use this step's V before its update, one step of lag); the actor's std is state-dependent
(``GaussianActor``; the reference learns a state-independent log-std), which changes nothing at evaluation (the mean
acts). The reference scales D4RL locomotion rewards so that returns span 1,000; here rewards are the dataset's (the
presets pick gamma and beta for them, as IQL's).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
import torch.nn.functional as F

from rlrobot.algorithms.bc import GaussianActor
from rlrobot.algorithms.offline import OfflineAlgorithm, OfflineConfig, adam, as_float, mlp, offline_spec, soft_update
from rlrobot.algorithms.registry import register_algorithm
from rlrobot.domains import NonNegative, NonNegativeInt, Positive, PositiveUnit
from rlrobot.policies.sac_policy import QEnsemble

if TYPE_CHECKING:
    from rlrobot.data.transitions import Transitions

DIVERGENCES = ("chi-square", "total-variation", "reverse-kl")
MAX_WEIGHT = 100.0
HUBER_DELTA = 20.0


# ---------------------------------------------------------------------------------------------- the losses
def chi_square_loss(x: torch.Tensor, alpha: float) -> torch.Tensor:
    """alpha max(x + x^2 / 4, 0) - (1 - alpha) x, elementwise (x = Q - V): the Pearson chi-square conjugate."""
    return alpha * torch.clamp(x + x.square() / 4.0, min=0.0) - (1.0 - alpha) * x


def total_variation_loss(x: torch.Tensor, alpha: float) -> torch.Tensor:
    """alpha max(x, 0) - (1 - alpha) x, elementwise: the total-variation conjugate."""
    return alpha * torch.clamp(x, min=0.0) - (1.0 - alpha) * x


def reverse_kl_loss(x: torch.Tensor, alpha: float, max_clip: float | None = None) -> torch.Tensor:
    """XQL's Gumbel loss e^z - z - 1 (z = x / alpha, capped at ``max_clip``), divided by e^m with m the batch's largest
    z (at least -1, no gradient): the gradients are those of e^z - z - 1 scaled by e^(-m), so one outlier cannot blow
    the step up. Elementwise over a batch [B] (or [n, B]: the max runs over the first axis, as the reference)."""
    z = x / alpha
    if max_clip is not None:
        z = z.clamp(max=max_clip)
    m = z.detach().max(0).values.clamp(min=-1.0)
    return torch.exp(z - m) - z * torch.exp(-m) - torch.exp(-m)


def dual_value_loss(x: torch.Tensor, divergence: str, alpha: float, max_clip: float | None = None) -> torch.Tensor:
    """The value's implicit-maximiser loss of ``divergence`` (elementwise; average it)."""
    if divergence == "chi-square":
        return chi_square_loss(x, alpha)
    if divergence == "total-variation":
        return total_variation_loss(x, alpha)
    if divergence == "reverse-kl":
        return reverse_kl_loss(x, alpha, max_clip)
    raise ValueError(f"divergence {divergence!r} is not one of {DIVERGENCES}")


def with_random_actions(s: torch.Tensor, actions: torch.Tensor, times: int,
                        generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The states and actions the value is fitted on: the data's, then ``times`` uniform actions in [-1, 1] per state."""
    if times == 0:
        return s, actions
    uniform = torch.rand((times * len(s), actions.shape[1]), generator=generator, device=s.device) * 2.0 - 1.0
    return torch.cat([s, s.repeat(times, 1)]), torch.cat([actions, uniform])


# ---------------------------------------------------------------------------------------------- the algorithm
@dataclass
class FDVLConfig(OfflineConfig):
    divergence: Literal["chi-square", "total-variation", "reverse-kl"] = "chi-square"
    """f of the value's dual loss: chi-square (the paper's), total-variation (its antmaze choice), reverse-kl (XQL's
    Gumbel regression)"""
    temperature: Positive = 0.8
    """alpha: the weight of the conjugate term against the linear one (chi-square, total-variation: in (0, 1]) or the
    Gumbel temperature (reverse-kl). The reference's locomotion command runs chi-square at 1, where nothing pulls V
    down (see the module docstring); 0.8 is its antmaze command's"""
    max_clip: Positive = 5.0
    """reverse-kl: the cap on (Q - V) / alpha (the reference's locomotion command: 5)"""
    random_actions: NonNegativeInt = 1
    """uniform actions per state added to the value's batch (the reference's sample_random_times; 0 = data only)"""
    beta: NonNegative = 3.0
    """inverse temperature of the actor's advantage weights"""
    tau: PositiveUnit = 0.005
    """Polyak rate of the target critics"""
    value_layer_norm: bool = True
    """LayerNorm in the value network (the reference's configs)"""
    actor_cosine_decay: bool = False
    """the actor's learning rate decays to 0 along a cosine over the run's gradient steps (the reference's, over its
    1M steps; at a few hundred or thousand steps it halts the actor early, see the module docstring)"""

    def validate(self, run) -> None:
        super().validate(run)
        name = run.spec.config_field
        if self.divergence not in DIVERGENCES:
            raise ValueError(f"{name}.divergence={self.divergence!r} is not one of {DIVERGENCES}")
        if self.temperature <= 0 or (self.divergence != "reverse-kl" and self.temperature > 1):
            raise ValueError(f"{name}.temperature must be in (0, 1] for {self.divergence} (> 0 for reverse-kl), got "
                             f"{self.temperature}")
        if self.max_clip <= 0:
            raise ValueError(f"{name}.max_clip must be > 0, got {self.max_clip}")
        if self.random_actions < 0:
            raise ValueError(f"{name}.random_actions must be >= 0, got {self.random_actions}")
        if self.beta < 0:
            raise ValueError(f"{name}.beta must be >= 0, got {self.beta}")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"{name}.tau must be in (0, 1], got {self.tau}")


class FDVL(OfflineAlgorithm):
    """Networks: ``critic`` (2 members), ``critic_target``, ``value``, ``actor``."""

    def __init__(self, cfg: FDVLConfig, obs_dim: int, action_dim: int, data: Transitions | None,
                 device: torch.device | str, generator: torch.Generator | None = None):
        super().__init__(cfg, obs_dim, action_dim, data, device, generator)
        nets = self.networks
        nets["critic"] = QEnsemble(obs_dim, action_dim, cfg.hidden, 2).to(self.device)
        nets["critic_target"] = copy.deepcopy(nets["critic"]).requires_grad_(False)
        nets["value"] = mlp(obs_dim, cfg.hidden, 1, layer_norm=cfg.value_layer_norm).to(self.device)
        nets["actor"] = GaussianActor(obs_dim, action_dim, cfg.hidden).to(self.device)
        self.optimizers["critic"] = adam([*nets["critic"].parameters(), *nets["value"].parameters()], lr=cfg.lr)
        self.optimizers["actor"] = adam(nets["actor"].parameters(), lr=cfg.lr)

    def actor_lr(self) -> float:
        """lr, or along a cosine from lr to 0 over the run's gradient steps (the reference's actor schedule)."""
        total = self.cfg.gradient_steps
        if not self.cfg.actor_cosine_decay or not total:
            return self.cfg.lr
        return self.cfg.lr * 0.5 * (1.0 + math.cos(math.pi * min(self.updates, total) / total))

    def losses(self, batch: Transitions) -> dict[str, torch.Tensor]:
        cfg, nets = self.cfg, self.networks
        s, s_next = self.normalize(batch.obs), self.normalize(batch.next_obs)
        s_v, a_v = with_random_actions(s, batch.actions, cfg.random_actions, self.generator)
        with torch.no_grad():
            q_target = nets["critic_target"](s_v, a_v).min(0).values
        v = nets["value"](s_v).squeeze(-1)
        value_loss = dual_value_loss(q_target - v, cfg.divergence, cfg.temperature, cfg.max_clip).mean()
        n = len(s)
        with torch.no_grad():
            advantage = q_target[:n] - v[:n]
            weights = torch.exp(cfg.beta * advantage).clamp(max=MAX_WEIGHT)
            next_v = nets["value"](s_next).squeeze(-1)
            td_target = batch.rewards + cfg.gamma * (~batch.terminals).float() * next_v
        q = nets["critic"](s, batch.actions)
        critic_loss = F.huber_loss(q, td_target.expand_as(q), delta=HUBER_DELTA) * q.shape[0]
        actor_loss = -(weights * nets["actor"].log_prob(s, batch.actions)).mean()
        return {"value": value_loss, "critic": critic_loss, "actor": actor_loss, "q": q.mean(), "v": v[:n].mean(),
                "advantage": advantage.mean(), "weight": weights.mean(), "above_v": (advantage > 0).float().mean()}

    def q_and_target(self, batch: Transitions) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean critic Q(s, a) and its TD target r + gamma (1 - terminal) V(s') (the critics' Huber loss aside)."""
        s, s_next = self.normalize(batch.obs), self.normalize(batch.next_obs)
        next_v = self.networks["value"](s_next).squeeze(-1)
        return self.networks["critic"](s, batch.actions).mean(0), batch.rewards + self.cfg.gamma * (~batch.terminals).float() * next_v

    def update(self) -> dict[str, float]:
        stats = self.losses(self.sample())
        for group in self.optimizers["actor"].param_groups:
            group["lr"] = self.actor_lr()
        for opt in self.optimizers.values():
            opt.zero_grad(set_to_none=True)
        (stats["value"] + stats["critic"] + stats["actor"]).backward()  # disjoint parameters, detached targets
        for opt in self.optimizers.values():
            opt.step()
        soft_update(self.networks["critic_target"], self.networks["critic"], self.cfg.tau)
        return as_float(stats)

    def act(self, obs: dict[str, torch.Tensor], deterministic: bool = True) -> torch.Tensor:
        return self.networks["actor"].act(self.normalize(obs), deterministic, None)


register_algorithm(offline_spec("f-dvl", "dual V-learning: V by an f-divergence implicit maximiser (chi-square, total "
                                "variation or XQL's Gumbel), Huber TD critics, advantage-weighted Gaussian actor "
                                "(offline)", FDVLConfig, FDVL))
