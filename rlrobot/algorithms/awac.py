"""Advantage-weighted actor-critic (AWAC, Nair et al. 2020, "Accelerating Online Reinforcement Learning with Offline
Datasets"): the offline pretraining phase.

- Critics: twin Q-functions (``num_critics``, min over all of them) with Polyak targets, fitted by TD to
  r + gamma (1 - terminal) min_i Q'_i(s', a'), a' ~ pi(. | s') (time-outs bootstrap); no entropy term in the target.
- Actor: the KL-constrained policy improvement solved in closed form and projected onto the policy by weighted
  maximum likelihood of the dataset's actions:

      L_pi = -E_{(s, a) ~ D}[ log pi(a | s) * w(s, a) ],   w = exp(A(s, a) / lambda),   A(s, a) = Q(s, a) - V(s)

  with Q = min_i Q_i(s, a) and V(s) = E_{a' ~ pi(. | s)}[min_i Q_i(s, a')] estimated with ``value_samples`` policy
  actions. ``weights``: ``batch`` divides exp(A / lambda) by its mean over the batch (B x softmax over the batch: the
  weights average 1 whatever the scale of Q); ``clip`` keeps exp(A / lambda) and caps it at ``max_weight``.
- Gaussian actor pi(a | s) = N(tanh(mu(s)), sigma(s)) over the actions themselves (not squashed: the log-likelihood of
  data actions at the bounds +-1 stays finite); acts with its mean tanh(mu(s)).

Matched with the paper and its reference code (rail-berkeley/rlkit ``AWACTrainer`` and its AWAC scripts; CORL's
``awac.py``): twin critics reduced by min, Polyak tau 5e-3, lr 3e-4, discount 0.99, TD to a sampled next action
without an entropy term (rlkit's scripts run alpha = 0), advantages from the current (not the target) critics with the
dataset action for Q and one sampled policy action for V, the per-state partition function Z(s) dropped as the paper
does, lambda = 1 by default (the default of both codes; rlkit's scripts sweep 2 for locomotion and 0.5 for the hand
tasks, CORL's fine-tuning configs use 0.1 for AntMaze and Adroit), batch-normalised weights by default (rlkit's
``normalize_over_batch``; CORL's exp capped at 100 is ``weights=clip``), the actor's Adam weight decay 1e-4 (rlkit's
scripts), the mean action at evaluation (rlkit's ``MakeDeterministic``, CORL's ``eval()`` mode).

Changed: sigma(s) comes from a state-dependent head squashed into [-5, 2] (rlkit's ``std_architecture="shared"``; its
scripts use a state-independent std in [-6, 0]) so that the actor's parameters are those of SAC's
``SquashedGaussianActor``: SAC's deterministic action tanh(mu(s)) is AWAC's mean action, and a warm start can continue
from an AWAC checkpoint (the spec is ``sac_compatible``). Policy actions for V and for the TD target are clipped to
[-1, 1] (CORL; the critics are fitted on in-range actions only). One hidden-size tuple for the actor and the critics
(rlkit: a 4x256 actor, 2x256 critics); batch 256 (CORL; rlkit 1024). Both losses come from one batch before one step
(rlkit's order; CORL steps the critics first and weighs the actor with the updated critics).

Online fine-tuning: AWAC continues the same update on a replay buffer that starts with the offline data and grows with
the policy's own transitions. That phase is not wired: ``--algo awac`` is the offline phase only (the offline runner).
Because the networks are SAC's, the warm-start runner continues from an AWAC checkpoint (``--algo wsrl --init
AWAC_RUN``), but with SAC's update, not AWAC's, and SAC's tanh-squashed sampling around the same mean.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

import torch
import torch.nn.functional as F

from rlrobot.algorithms.offline import OfflineAlgorithm, OfflineConfig, adam, as_float, offline_spec, soft_update
from rlrobot.algorithms.registry import register_algorithm
from rlrobot.domains import NonNegative, Positive, PositiveInt, PositiveUnit
from rlrobot.policies.sac_policy import QEnsemble, SquashedGaussianActor

if TYPE_CHECKING:
    from rlrobot.config import TrainConfig
    from rlrobot.data.transitions import Transitions

WEIGHTINGS = ("batch", "clip")


@dataclass
class AWACConfig(OfflineConfig):
    temperature: Positive = 1.0
    """lambda: the advantages are divided by it before exp (smaller: greedier, larger: closer to behaviour cloning)"""
    weights: Literal["batch", "clip"] = "batch"
    """batch: exp(A / lambda) divided by its mean over the batch (rlkit's AWAC); clip: exp(A / lambda) capped at
    max_weight (CORL's)"""
    max_weight: Positive = 100.0
    """cap of the weights with weights=clip"""
    value_samples: PositiveInt = 1
    """policy actions per state averaged in V(s) = E_pi[Q(s, a')] (the reference code: 1)"""
    actor_weight_decay: NonNegative = 1e-4
    """Adam weight decay of the actor (rlkit's AWAC scripts: 1e-4; the critics have none)"""
    tau: PositiveUnit = 0.005
    """Polyak rate of the target critics"""
    num_critics: PositiveInt = 2
    """critics in the ensemble; targets and advantages use the min over all of them (2: the paper's twin critics)"""
    critic_layer_norm: bool = False
    """LayerNorm in every critic layer (for a warm start that wants WSRL's LayerNorm critics)"""

    actor_q: ClassVar[str] = "min"
    """how the critics are reduced (what a warm start from this run adopts)"""

    @property
    def num_target_critics(self) -> int:
        """The TD target's min runs over every target critic (what a warm start from this run adopts)."""
        return self.num_critics

    def validate(self, run: TrainConfig) -> None:
        super().validate(run)
        if self.temperature <= 0:
            raise ValueError(f"awac.temperature must be > 0, got {self.temperature}")
        if self.weights not in WEIGHTINGS:
            raise ValueError(f"awac.weights={self.weights!r} is not one of {WEIGHTINGS}")
        if self.max_weight <= 0:
            raise ValueError(f"awac.max_weight must be > 0, got {self.max_weight}")
        if self.value_samples < 1:
            raise ValueError(f"awac.value_samples must be >= 1, got {self.value_samples}")
        if self.actor_weight_decay < 0:
            raise ValueError(f"awac.actor_weight_decay must be >= 0, got {self.actor_weight_decay}")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"awac.tau must be in (0, 1], got {self.tau}")
        if self.num_critics < 1:
            raise ValueError(f"awac.num_critics must be >= 1, got {self.num_critics}")


def advantage_weights(advantage: torch.Tensor, temperature: float, weights: str = "batch",
                      max_weight: float = 100.0) -> torch.Tensor:
    """The actor's per-sample weights from advantages [B]: exp(A / lambda), divided by its batch mean (``batch``,
    computed as B x softmax so that large A / lambda cannot overflow) or capped at ``max_weight`` (``clip``)."""
    scores = advantage / temperature
    if weights == "batch":
        return scores.softmax(0) * scores.shape[0]
    return scores.exp().clamp(max=max_weight)


def gaussian_log_prob(mean: torch.Tensor, log_std: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """log N(actions | mean, exp(log_std)) summed over the action dimensions: [B]."""
    return (-0.5 * ((actions - mean) / log_std.exp()).square() - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)


class AWAC(OfflineAlgorithm):
    def __init__(self, cfg: AWACConfig, obs_dim: int, action_dim: int, data: Transitions | None, device: torch.device | str,
                 generator: torch.Generator | None = None):
        super().__init__(cfg, obs_dim, action_dim, data, device, generator)
        nets = self.networks
        nets["critic"] = QEnsemble(obs_dim, action_dim, cfg.hidden, cfg.num_critics,
                                   layer_norm=cfg.critic_layer_norm).to(self.device)
        nets["critic_target"] = copy.deepcopy(nets["critic"]).requires_grad_(False)
        nets["actor"] = SquashedGaussianActor(obs_dim, action_dim, cfg.hidden).to(self.device)
        self.optimizers["critic"] = adam(nets["critic"].parameters(), lr=cfg.lr)
        self.optimizers["actor"] = adam(nets["actor"].parameters(), lr=cfg.lr, weight_decay=cfg.actor_weight_decay)

    # ------------------------------------------------------------------ the policy
    def distribution(self, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean tanh(mu(s)) in [-1, 1] and log sigma(s) of the Gaussian over actions."""
        mean, log_std = self.networks["actor"](s)
        return torch.tanh(mean), log_std

    def sample_actions(self, s: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """a ~ N(tanh(mu(s)), sigma(s)), clipped to the action bounds."""
        mean, log_std = self.distribution(s)
        noise = torch.randn(mean.shape, generator=generator, device=mean.device)
        return (mean + log_std.exp() * noise).clamp(-1.0, 1.0)

    # ------------------------------------------------------------------ the losses
    def q_min(self, critic: QEnsemble, s: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return critic(s, actions).min(0).values

    def advantages(self, s: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A(s, a) = Q(s, a) - V(s), V(s) the mean of Q over ``value_samples`` policy actions, current critics: [B]
        each (no gradient: the weights are constants of the actor's loss)."""
        k = self.cfg.value_samples
        with torch.no_grad():
            q = self.q_min(self.networks["critic"], s, actions)
            s_rep = s.repeat_interleave(k, 0)
            v = self.q_min(self.networks["critic"], s_rep, self.sample_actions(s_rep, self.generator)).view(len(s), k).mean(1)
        return q - v, v

    def critic_loss(self, batch: Transitions, s: torch.Tensor, s_next: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cfg, nets = self.cfg, self.networks
        with torch.no_grad():
            q_next = self.q_min(nets["critic_target"], s_next, self.sample_actions(s_next, self.generator))
            target = batch.rewards + cfg.gamma * (~batch.terminals).float() * q_next
        q = nets["critic"](s, batch.actions)
        return F.mse_loss(q, target.expand_as(q)) * q.shape[0], q  # the sum of the critics' mean squared errors

    def actor_loss(self, s: torch.Tensor, actions: torch.Tensor, advantage: torch.Tensor) -> dict[str, torch.Tensor]:
        """-E[log pi(a | s) w(s, a)] over the batch, with the weights and the policy's mean log sigma to log."""
        cfg = self.cfg
        weights = advantage_weights(advantage, cfg.temperature, cfg.weights, cfg.max_weight)
        mean, log_std = self.distribution(s)
        loss = -(gaussian_log_prob(mean, log_std, actions) * weights).mean()
        return {"actor": loss, "weight_max": weights.max(), "log_std": log_std.mean()}

    def q_and_target(self, batch: Transitions) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean critic Q(s, a) and the TD target r + gamma (1 - terminal) min_i Q'_i(s', a'), a' the policy's mean
        action (the training target's sampled a' made deterministic, so the diagnostic does not jitter)."""
        nets = self.networks
        s, s_next = self.normalize(batch.obs), self.normalize(batch.next_obs)
        q_next = self.q_min(nets["critic_target"], s_next, self.distribution(s_next)[0])
        return nets["critic"](s, batch.actions).mean(0), batch.rewards + self.cfg.gamma * (~batch.terminals).float() * q_next

    def update(self) -> dict[str, float]:
        batch = self.sample()
        s, s_next = self.normalize(batch.obs), self.normalize(batch.next_obs)
        critic_loss, q = self.critic_loss(batch, s, s_next)
        advantage, v = self.advantages(s, batch.actions)
        actor = self.actor_loss(s, batch.actions, advantage)
        for opt in self.optimizers.values():
            opt.zero_grad(set_to_none=True)
        (critic_loss + actor["actor"]).backward()  # disjoint parameters: the TD targets and the weights are constants
        for opt in self.optimizers.values():
            opt.step()
        soft_update(self.networks["critic_target"], self.networks["critic"], self.cfg.tau)
        return as_float({"critic": critic_loss, **actor, "q": q.mean(), "v": v.mean(), "advantage": advantage.mean()})

    def act(self, obs: dict[str, torch.Tensor], deterministic: bool = True) -> torch.Tensor:
        s = self.normalize(obs)
        if deterministic:
            return self.distribution(s)[0]
        return self.sample_actions(s, None)  # the global stream: an acting-only learner's generator may be elsewhere


register_algorithm(offline_spec("awac", "AWAC: twin critics by TD to the policy's next action, Gaussian actor by "
                                "advantage-weighted likelihood of the data (offline, LeRobotDataset)", AWACConfig, AWAC,
                                sac_compatible=True))
