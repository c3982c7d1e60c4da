"""Soft Actor-Critic, vectorised and high-UTD, readable top to bottom.

- Actor: tanh-squashed Gaussian; loss E[alpha log pi(a|s) - Q(s, a)] with Q the min (or mean) over the critics.
- Critics: an ensemble of N Q-functions (N=2: SAC's twin Q; N=10 with a random subset of M=2 for the target:
  REDQ, as WSRL uses), optional LayerNorm. Target y = r_n + gamma^n (1 - terminated) [min_{i in M} Q'_i(s', a')
  - alpha log pi(a'|s')], with the n-step return r_n and a' ~ pi(s') from the replay buffer.
- Temperature: alpha = exp(log_alpha) tuned so that the policy entropy tracks the target (default -|A|).
- Polyak target update with rate tau, after every critic step.
- UTD as RLPD, REDQ and WSRL mean it: ``utd`` critic gradient steps per collected transition, each on its own
  minibatch of ``batch_size``, and ONE actor and temperature step per collected transition (one per critic step when
  utd < 1). The steps of one transition form a round (``update_round``); the actor step reads the round's last
  minibatch (RLPD's ``utd_ratio`` loop) or all of the round's minibatches (``actor_batch="round"``: WSRL's
  ``update_high_utd``, which splits one batch of 1,024 into 4 critic minibatches and steps the actor on the whole).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from rlrobot.algorithms.registry import AlgorithmConfig, AlgorithmSpec, register_algorithm
from rlrobot.curricula.jump_start import JSRLInput
from rlrobot.data.replay_buffer import ReplayBuffer
from rlrobot.domains import Finite, NonNegative, NonNegativeInt, Positive, PositiveInt, PositiveUnit, UnitInterval
from rlrobot.policies.sac_policy import SACPolicy

ACTOR_Q_REDUCTIONS = ("min", "mean")
ACTOR_BATCHES = ("last", "round")


@dataclass
class SACConfig(AlgorithmConfig):
    gamma: UnitInterval = 0.99
    """discount"""
    tau: PositiveUnit = 0.005
    """Polyak rate of the target critics"""
    batch_size: PositiveInt = 512
    """transitions per critic gradient step"""
    utd: Positive = 0.5
    """update-to-data ratio as the papers mean it (RLPD, REDQ, WSRL): critic gradient steps per collected transition
    (summed over envs; fractions carry over), with one actor and temperature step per collected transition (one per
    critic step when utd < 1)"""
    actor_batch: Literal["last", "round"] = "last"
    """what the actor and temperature step of a round reads: the round's last critic minibatch (RLPD) or all of the
    round's minibatches together (WSRL)"""
    learning_starts: NonNegativeInt = 4_000
    """transitions collected with uniform random actions before the first update"""
    buffer_size: PositiveInt = 1_000_000
    """replay capacity in transitions"""
    n_step: PositiveInt = 1
    """n of the n-step return"""
    rollout_steps: PositiveInt = 4
    """vector-env steps collected between two update phases (one runner iteration)"""
    save_replay: bool = False
    """write the replay buffer with each checkpoint so that --resume continues without a cold buffer"""
    actor_lr: Positive = 3e-4
    """actor learning rate"""
    critic_lr: Positive = 3e-4
    """critic learning rate"""
    alpha_lr: Positive = 3e-4
    """temperature learning rate"""
    init_alpha: Positive = 1.0
    """initial entropy temperature"""
    autotune_alpha: bool = True
    """tune the temperature toward target_entropy"""
    target_entropy: Finite | None = None
    """entropy target of the temperature tuning (None = -|A|)"""
    num_target_critics: PositiveInt = 2
    """size of the random critic subset whose min forms the target (REDQ's M; = policy.num_critics for plain SAC)"""
    actor_q: Literal["min", "mean"] = "min"
    """how the actor reduces the critic ensemble: min (SAC) or mean (REDQ)"""
    actor_update_every: PositiveInt = 1
    """update rounds (one per collected transition at utd >= 1) per actor and temperature step: TD3's policy delay"""
    max_grad_norm: NonNegative = 0.0
    """gradient-norm clip for actor and critics (0 = off)"""

    def env_steps_per_iteration(self, run) -> int:
        return run.num_envs * self.rollout_steps

    def validate(self, run) -> None:
        """Every bad value named with its field and what is allowed, before anything is built."""
        num_envs = run.num_envs
        if self.actor_q not in ACTOR_Q_REDUCTIONS:
            raise ValueError(f"sac.actor_q={self.actor_q!r} is not one of {ACTOR_Q_REDUCTIONS}")
        if self.actor_batch not in ACTOR_BATCHES:
            raise ValueError(f"sac.actor_batch={self.actor_batch!r} is not one of {ACTOR_BATCHES}")
        if not self.utd > 0:
            raise ValueError(f"sac.utd must be > 0 (gradient updates per collected transition), got {self.utd}")
        for name in ("batch_size", "n_step", "rollout_steps", "num_target_critics", "actor_update_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"sac.{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"sac.tau must be in (0, 1], got {self.tau}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"sac.gamma must be in [0, 1], got {self.gamma}")
        if self.num_target_critics > run.policy.num_critics:
            raise ValueError(f"sac.num_target_critics={self.num_target_critics} exceeds policy.num_critics="
                             f"{run.policy.num_critics}")
        if self.init_alpha <= 0:
            raise ValueError(f"sac.init_alpha must be > 0, got {self.init_alpha}")
        if self.buffer_size < num_envs:
            raise ValueError(f"sac.buffer_size={self.buffer_size} is smaller than num_envs={num_envs}: one vector step "
                             "must fit in the replay buffer")
        if self.buffer_size < self.learning_starts:
            raise ValueError(f"sac.buffer_size={self.buffer_size} is smaller than sac.learning_starts="
                             f"{self.learning_starts}: updates would never start")
        # what the buffer can sample when updates start: the newest n-1 steps of each env wait for their future
        samplable = (max(self.learning_starts, num_envs) // num_envs - (self.n_step - 1)) * num_envs
        if self.batch_size > samplable:
            raise ValueError(f"sac.batch_size={self.batch_size} is larger than the replay contents at learning start "
                             f"({samplable} samplable transitions with sac.learning_starts={self.learning_starts}, "
                             f"num_envs={num_envs}, sac.n_step={self.n_step}); raise sac.learning_starts or lower "
                             "sac.batch_size")


class SAC:
    def __init__(self, policy: SACPolicy, cfg: SACConfig, device: torch.device, num_envs: int,
                 obs_specs: dict[str, tuple[tuple[int, ...], torch.dtype]], sync=None):
        self.policy, self.cfg, self.device = policy, cfg, device
        self.replay = ReplayBuffer(cfg.buffer_size, num_envs, {k: shape for k, (shape, _) in obs_specs.items()},
                                   policy.action_dim, device, obs_dtypes={k: dtype for k, (_, dtype) in obs_specs.items()},
                                   n_step=cfg.n_step, gamma=cfg.gamma)
        self.update_debt = 0.0  # fractional updates carried to the next iteration
        self.sync = sync  # data-parallel: gradients all-reduced before each step (rlrobot.runners.distributed)
        self.actor_optimizer = torch.optim.Adam(policy.actor.parameters(), lr=cfg.actor_lr, **_fast_adam(device))
        self.critic_optimizer = torch.optim.Adam(policy.critic.parameters(), lr=cfg.critic_lr, **_fast_adam(device))
        self.log_alpha = torch.tensor(float(torch.log(torch.tensor(cfg.init_alpha))), device=device, requires_grad=True)
        self.alpha_optimizer = torch.optim.Adam([self.log_alpha], lr=cfg.alpha_lr)
        self.target_entropy = -float(policy.action_dim) if cfg.target_entropy is None else cfg.target_entropy
        self.num_updates = 0  # critic gradient steps
        self.rounds = 0  # update rounds (one per collected transition at utd >= 1)

    @property
    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"actor": self.actor_optimizer, "critic": self.critic_optimizer, "alpha": self.alpha_optimizer}

    def state_dict(self) -> dict[str, Any]:
        """Optimizers, temperature and counters (the replay buffer is ``replay_state_dict``, saved only on request)."""
        return {"optimizers": {k: o.state_dict() for k, o in self.optimizers.items()},
                "log_alpha": self.log_alpha.detach().clone(), "num_updates": self.num_updates, "rounds": self.rounds,
                "update_debt": self.update_debt}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, optimizer in self.optimizers.items():
            optimizer.load_state_dict(state["optimizers"][name])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        self.num_updates, self.update_debt = state["num_updates"], state["update_debt"]
        self.rounds = state.get("rounds", self.num_updates)  # runs saved before rounds: one critic step per round

    def replay_state_dict(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        return self.replay.state_dict()

    def load_replay_state_dict(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        self.replay.load_state_dict(tensors, meta)

    def rounds_due(self, transitions: int) -> list[int]:
        """Critic steps of each update round owed for ``transitions`` new transitions: ``utd`` x transitions critic
        steps (fractions carry over) in min(critic steps, transitions) rounds, each ending with one actor step."""
        self.update_debt += self.cfg.utd * transitions
        critic_steps = int(self.update_debt)
        self.update_debt -= critic_steps
        rounds = min(critic_steps, transitions)
        return [(i + 1) * critic_steps // rounds - i * critic_steps // rounds for i in range(rounds)]

    @property
    def alpha(self) -> torch.Tensor:
        return self.log_alpha.detach().exp()

    def _target_q(self, q: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """Min over a random subset of M target critics (REDQ); all of them when M = N."""
        n, m = self.policy.cfg.num_critics, self.cfg.num_target_critics
        if m < n:
            subset = torch.randperm(n, device=q.device, generator=generator)[:m]
            q = q[subset]
        return q.min(0).values

    def update(self, batch: dict[str, Any], generator: torch.Generator | None = None) -> dict[str, Any]:
        """One round of one critic step: what an update is at utd <= 1."""
        return self.update_round([batch], generator)

    def update_round(self, batches: list[dict[str, Any]], generator: torch.Generator | None = None) -> dict[str, Any]:
        """A critic step on each minibatch, then the actor and temperature step (every ``actor_update_every`` rounds)
        on the last minibatch or on all of them (``actor_batch``); returns the critics' mean figures and the actor's."""
        features, sums = [], {}
        for batch in batches:
            x, stats = self.critic_step(batch, generator)
            features.append(x)
            for k, v in stats.items():
                sums[k] = sums.get(k, 0.0) + v
        stats = {k: v / len(batches) for k, v in sums.items()}
        if self.rounds % self.cfg.actor_update_every == 0:
            x = torch.cat(features) if self.cfg.actor_batch == "round" and len(features) > 1 else features[-1]
            stats = self.actor_step(x, stats)
        self.rounds += 1
        stats["alpha"] = self.alpha
        return stats

    def critic_loss(self, x: torch.Tensor, batch: dict[str, Any], generator: torch.Generator | None
                    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """SAC's soft TD loss from the target ensemble, summed over critics, and its figures."""
        policy = self.policy
        next_x = policy.features(batch["next_obs"])
        with torch.no_grad():
            next_action, next_log_prob = policy.actor.sample(next_x)
            next_q = self._target_q(policy.critic_target(next_x, next_action), generator)
            target = batch["rewards"] + batch["discount"] * (next_q - self.alpha * next_log_prob)
        q = policy.critic(x, batch["actions"])  # [N, B]
        loss = (q - target).square().mean(1).sum()
        return loss, {"critic_loss": loss.detach(), "q_mean": q.detach().mean()}

    def critic_step(self, batch: dict[str, Any], generator: torch.Generator | None = None
                    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """One gradient step of the critics and the Polyak update of their targets: (the batch's features, figures)."""
        cfg, policy = self.cfg, self.policy
        x = policy.features(batch["obs"])
        loss, stats = self.critic_loss(x, batch, generator)
        self.critic_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self._reduce_gradients(policy.critic.parameters())
        if cfg.max_grad_norm > 0:
            nn.utils.clip_grad_norm_(policy.critic.parameters(), cfg.max_grad_norm)
        self.critic_optimizer.step()
        with torch.no_grad():
            torch._foreach_lerp_(list(policy.critic_target.parameters()), list(policy.critic.parameters()), cfg.tau)
        self.num_updates += 1
        return x, stats

    def actor_step(self, x: torch.Tensor, stats: dict[str, Any]) -> dict[str, Any]:
        """The actor and temperature steps on features ``x``; returns ``stats`` with their figures added."""
        cfg, policy = self.cfg, self.policy
        policy.critic.requires_grad_(False)  # the actor loss must not leave gradients in the critics
        action, log_prob = policy.actor.sample(x.detach())
        q_pi = policy.critic(x.detach(), action)
        q_pi = q_pi.min(0).values if cfg.actor_q == "min" else q_pi.mean(0)
        actor_loss = (self.alpha * log_prob - q_pi).mean()
        self.actor_optimizer.zero_grad(set_to_none=True)
        actor_loss.backward()
        self._reduce_gradients(policy.actor.parameters())
        if cfg.max_grad_norm > 0:
            nn.utils.clip_grad_norm_(policy.actor.parameters(), cfg.max_grad_norm)
        self.actor_optimizer.step()
        policy.critic.requires_grad_(True)
        stats["actor_loss"] = actor_loss.detach()
        stats["entropy"] = -log_prob.detach().mean()
        if cfg.autotune_alpha:
            alpha_loss = -(self.log_alpha * (log_prob.detach() + self.target_entropy)).mean()
            self.alpha_optimizer.zero_grad(set_to_none=True)
            alpha_loss.backward()
            self._reduce_gradients([self.log_alpha])
            self.alpha_optimizer.step()
            stats["alpha_loss"] = alpha_loss.detach()
        return stats

    def _reduce_gradients(self, params) -> None:
        if self.sync:
            self.sync.gradients(params)


def _fast_adam(device: torch.device) -> dict[str, bool]:
    """Fused Adam (one kernel for all parameters): a large share of a small-network update on the CPU otherwise."""
    return {"fused": True} if device.type in ("cpu", "cuda") else {}


register_algorithm(AlgorithmSpec(
    name="sac", summary="SAC / REDQ with a device replay buffer, high UTD, n-step returns", config_field="sac",
    config=SACConfig, policy_kind="sac", runner="rlrobot.runners.off_policy:OffPolicyRunner", run_fields=(JSRLInput,),
    sac_compatible=True))
