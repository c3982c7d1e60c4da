"""PPO, RSL-RL-grade and readable top to bottom.

Clipped surrogate and value loss, entropy bonus, GAE, gradient clipping, minibatches x epochs, and RSL-RL's
adaptive learning rate driven by the KL between the rollout policy and the current one. Timeouts are bootstrapped
with V(final_obs) by the runner, which has the true final observation thanks to same-step autoreset.

The pieces flow-policy PPO shares (adaptive-KL learning rate, advantage normalisation, clipped value loss) are the
functions and ``AdaptiveLR`` below.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from rlrobot.algorithms.registry import AlgorithmConfig, AlgorithmSpec, register_algorithm
from rlrobot.curricula.jump_start import JSRLInput
from rlrobot.data.rollout_storage import RolloutStorage, masked_mean
from rlrobot.domains import NonNegative, Positive, PositiveInt, UnitInterval
from rlrobot.policies.actor_critic import ActorCritic

LR_SCHEDULES = ("adaptive", "fixed", "linear")
_LOG_SQRT_2PI = math.log(math.sqrt(2 * math.pi))


@dataclass
class PPOConfig(AlgorithmConfig):
    rollout_steps: PositiveInt = 24
    """vector-env steps per env per iteration (the rollout length)"""
    num_epochs: PositiveInt = 5
    """passes over each rollout"""
    num_minibatches: PositiveInt = 4
    """minibatches per pass"""
    clip: Positive = 0.2
    """PPO ratio clip epsilon"""
    value_clip: Positive = 0.2
    """clip of the value update around the rollout's values"""
    gamma: UnitInterval = 0.99
    """discount"""
    lam: UnitInterval = 0.95
    """GAE lambda"""
    value_coef: NonNegative = 1.0
    """weight of the value loss"""
    entropy_coef: NonNegative = 0.01
    """weight of the entropy bonus"""
    lr: Positive = 1e-3
    """the starting value when lr_schedule is adaptive"""
    lr_schedule: Literal["adaptive", "fixed", "linear"] = "adaptive"
    """adaptive: RSL-RL's rule (KL > 2 x desired_kl: lr / 1.5; 0 < KL < desired_kl / 2: lr x 1.5) | fixed | linear:
    lr x (1 - i / N) in iteration i = 0..N-1 of the run (CleanRL's anneal_lr)"""
    desired_kl: Positive = 0.01
    """KL target of the adaptive schedule"""
    lr_min: Positive = 1e-5
    """lower bound of the adaptive lr"""
    lr_max: Positive = 1e-2
    """upper bound of the adaptive lr"""
    max_grad_norm: Positive = 1.0
    """global gradient-norm clip"""
    normalize_advantages: bool = True
    """advantages to zero mean, unit std per update"""
    normalize_rewards: bool = False
    """divide each reward by the running std of the envs' discounted returns, then clip to +-reward_clip (the
    NormalizeReward of gym / baselines' VecNormalize that CleanRL's MuJoCo PPO uses); episode returns in the logs
    and evaluations stay unscaled"""
    reward_clip: Positive = 10.0
    """clip of the normalised reward (with normalize_rewards)"""
    fused_adam: bool = False
    """Adam as one fused kernel over all parameters (CPU / CUDA): ~2.5x faster optimizer step on the CPU, the same
    update up to float rounding (not bit-identical to the default, hence opt-in)"""
    compile: bool = False
    """torch.compile the minibatch loss (forward and backward as generated kernels; on the CPU it needs a C++
    compiler): 1.15-1.3x faster minibatch step on the development CPU, the same update up to float rounding (opt-in);
    the first update pays the compile (3-25 s measured there), so it pays off in runs of several minutes"""
    overlap: bool = False
    """collect the next rollout while the update runs (on a second thread): the rollout acts with the policy of one
    update before (APPO's one-step staleness), corrected as decoupled PPO: ratio, clip and KL around the policy the
    update starts from, each sample weighted by that policy's ratio to the acting one. Evaluations, checkpoints and the
    last iteration wait for the update (a whole, current policy)"""

    def validate(self, run) -> None:
        validate_ppo_common(self, "ppo")
        validate_overlap(self, run, "ppo")
        if self.rollout_steps < 1:
            raise ValueError(f"ppo.rollout_steps must be >= 1, got {self.rollout_steps}")
        per_iteration = run.num_envs * self.rollout_steps
        if self.normalize_rewards and not self.reward_clip > 0:
            raise ValueError(f"ppo.reward_clip must be > 0, got {self.reward_clip}")
        if per_iteration % self.num_minibatches:
            raise ValueError(f"num_envs x ppo.rollout_steps = {per_iteration} must be divisible by "
                             f"ppo.num_minibatches={self.num_minibatches}")

    def env_steps_per_iteration(self, run) -> int:
        return run.num_envs * self.rollout_steps


def validate_overlap(cfg, run, section: str) -> None:
    """``overlap`` runs the update on a second thread of this process: data-parallel ranks would need their collectives
    ordered across two threads, which is not offered."""
    if cfg.overlap and run.distributed:
        raise ValueError(f"{section}.overlap runs the update on a second thread of one process; it does not combine "
                         "with --distributed (drop one of them)")


def validate_ppo_common(cfg, section: str) -> None:
    """Checks PPO and flow-policy PPO share (``section`` names the CLI prefix in the message)."""
    for name in ("num_epochs", "num_minibatches"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"{section}.{name} must be >= 1, got {getattr(cfg, name)}")
    if cfg.lr_schedule not in LR_SCHEDULES:
        raise ValueError(f"{section}.lr_schedule={cfg.lr_schedule!r} is not one of {LR_SCHEDULES}")
    for name in ("lr", "lr_min", "lr_max", "clip", "desired_kl"):
        if not getattr(cfg, name) > 0:
            raise ValueError(f"{section}.{name} must be > 0, got {getattr(cfg, name)}")
    if not 0.0 <= cfg.gamma <= 1.0 or not 0.0 <= cfg.lam <= 1.0:
        raise ValueError(f"{section}.gamma and {section}.lam must be in [0, 1], got {cfg.gamma} and {cfg.lam}")


class AdaptiveLR:
    """RSL-RL's KL-adaptive learning rate: lr / 1.5 when KL > 2 x desired, lr x 1.5 when 0 < KL < desired / 2, kept
    in [lr_min, lr_max] and written into the optimizer's param groups ``groups`` (indices: the optimizer replaces its
    group dicts when it loads a state_dict, so they are looked up each time)."""

    def __init__(self, cfg, optimizer: torch.optim.Optimizer, groups: tuple[int, ...] | None = None):
        self.cfg, self.optimizer = cfg, optimizer
        self.groups = tuple(range(len(optimizer.param_groups))) if groups is None else groups
        self.lr = cfg.lr

    def step(self, kl: float | torch.Tensor) -> None:
        cfg = self.cfg
        if cfg.lr_schedule != "adaptive":
            return
        if kl > 2.0 * cfg.desired_kl:
            self.lr = max(cfg.lr_min, self.lr / 1.5)
        elif 0.0 < kl < cfg.desired_kl / 2.0:
            self.lr = min(cfg.lr_max, self.lr * 1.5)
        self._write()

    def start_at(self, lr: float) -> None:
        """Set the adaptive lr's current value (kept in [lr_min, lr_max]) and write it into the optimizer."""
        self.lr = min(self.cfg.lr_max, max(self.cfg.lr_min, lr))
        self._write()

    def begin_iteration(self, iteration: int, total_iterations: int) -> None:
        """The linear schedule's lr for iteration ``iteration`` (0-based) of ``total_iterations``; the runner calls
        it before each update (other schedules ignore it)."""
        if self.cfg.lr_schedule != "linear":
            return
        self.lr = self.cfg.lr * (1.0 - iteration / max(total_iterations, 1))
        self._write()

    def _write(self) -> None:
        for i in self.groups:
            self.optimizer.param_groups[i]["lr"] = self.lr


class ReturnNormalizer:
    """Rewards divided by the running std of the discounted return (baselines' VecNormalize / gym's NormalizeReward as
    CleanRL uses them): per env G <- gamma G + r, the running variance of G over every step of every env, r /
    sqrt(var + eps) clipped to +-clip, G <- 0 where an episode ended. On the device, no per-env loop. In data-parallel
    training each rank keeps its own statistics (as each process's env wrapper would)."""

    def __init__(self, num_envs: int, gamma: float, clip: float, device: torch.device, eps: float = 1e-8):
        self.gamma, self.clip, self.eps = gamma, clip, eps
        self.returns = torch.zeros(num_envs, device=device)
        self.mean = torch.zeros((), dtype=torch.float64, device=device)
        self.var = torch.ones((), dtype=torch.float64, device=device)
        self.count = torch.tensor(1e-4, dtype=torch.float64, device=device)  # baselines' RunningMeanStd start

    def __call__(self, reward: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        self.returns = self.returns * self.gamma + reward
        g = self.returns.to(torch.float64)
        n = g.numel()
        batch_mean, batch_var = g.mean(), g.var(unbiased=False)
        total = self.count + n
        delta = batch_mean - self.mean
        # Chan et al.'s parallel update (RunningMeanStd), reassigned rather than in place: rollouts run in
        # inference mode, and these tensors are also read and checkpointed outside it
        self.mean = self.mean + delta * n / total
        self.var = (self.var * self.count + batch_var * n + delta.square() * self.count * n / total) / total
        self.count = total
        scaled = (reward / torch.sqrt(self.var + self.eps).to(reward.dtype)).clamp(-self.clip, self.clip)
        self.returns = torch.where(done, torch.zeros_like(self.returns), self.returns)
        return scaled

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"returns": self.returns.clone(), "mean": self.mean.clone(), "var": self.var.clone(),
                "count": self.count.clone()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        device = self.returns.device
        self.returns, self.mean, self.var, self.count = (state[k].to(device) for k in ("returns", "mean", "var", "count"))


def normalized_advantages(advantages: torch.Tensor, sync=None, mask: torch.Tensor | None = None) -> torch.Tensor:
    """(A - mean) / std, with the statistics over all ranks in data-parallel training; with ``mask`` (the learner's
    own steps, rollout_storage) the statistics come from the masked-in steps only."""
    if mask is not None and not bool((mask > 0).all()):
        kept = advantages[mask > 0]
        if kept.numel() < 2:  # nothing (or one step) of the learner's own: nothing to normalise with
            return advantages
        mean, std = kept.mean(), kept.std()
        return (advantages - mean) / (std + 1e-8)
    mean, std = sync.global_mean_std(advantages) if sync else (advantages.mean(), advantages.std())
    return (advantages - mean) / (std + 1e-8)


def gaussian_log_prob(value: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """``Normal(mean, std).log_prob(value)`` with torch.distributions' exact ops (bit-identical), without the object."""
    return -((value - mean) ** 2) / (2 * std**2) - std.log() - _LOG_SQRT_2PI


def gaussian_entropy(std: torch.Tensor) -> torch.Tensor:
    """``Normal(., std).entropy()`` with torch.distributions' exact ops."""
    return 0.5 + 0.5 * math.log(2 * math.pi) + torch.log(std)


def clipped_value_loss(value: torch.Tensor, old_value: torch.Tensor, returns: torch.Tensor, clip: float,
                       mask: torch.Tensor | None = None) -> torch.Tensor:
    clipped = old_value + (value - old_value).clamp(-clip, clip)
    return masked_mean(torch.max((value - returns).square(), (clipped - returns).square()), mask)


class PPO:
    def __init__(self, policy: ActorCritic, cfg: PPOConfig, device: torch.device, num_envs: int,
                 obs_specs: dict[str, tuple[tuple[int, ...], torch.dtype]], sync=None):
        self.policy, self.cfg, self.device = policy, cfg, device
        self.sync = sync  # data-parallel reductions (rlrobot.runners.distributed); None in one process
        fused = {"fused": True} if cfg.fused_adam and device.type in ("cpu", "cuda") else {}
        self.optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.lr, **fused)
        self.lr_schedule = AdaptiveLR(cfg, self.optimizer)
        self._losses = torch.compile(self._minibatch_losses) if cfg.compile else self._minibatch_losses
        self.reward_normalizer = (ReturnNormalizer(num_envs, cfg.gamma, cfg.reward_clip, device)
                                  if cfg.normalize_rewards else None)
        a = ((policy.action_dim,), torch.float32)
        scalar = ((), torch.float32)
        self.storage = RolloutStorage(cfg.rollout_steps, num_envs, obs_specs, {
            "actions": a, "log_probs": scalar, "action_mean": a, "action_std": a}, device)

    def state_dict(self) -> dict[str, Any]:
        state = {"optimizer": self.optimizer.state_dict(), "lr": self.lr_schedule.lr}
        if self.reward_normalizer is not None:
            state["reward_normalizer"] = self.reward_normalizer.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.lr_schedule.lr = state["lr"]
        for group in self.optimizer.param_groups:
            group["lr"] = state["lr"]
        if self.reward_normalizer is not None:
            if "reward_normalizer" not in state:
                raise ValueError("ppo.normalize_rewards is on but the checkpoint was trained without it (no return "
                                 "statistics to resume); resume without --ppo.normalize-rewards or start a new run")
            self.reward_normalizer.load_state_dict(state["reward_normalizer"])

    def begin_iteration(self, iteration: int, total_iterations: int) -> None:
        """Called by the runner before each update: the linear lr schedule's step."""
        self.lr_schedule.begin_iteration(iteration, total_iterations)

    def scale_rewards(self, reward: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        """The rewards PPO learns from: scaled by the return normaliser when ``normalize_rewards`` is on."""
        return reward if self.reward_normalizer is None else self.reward_normalizer(reward, done)

    @torch.no_grad()
    def act(self, obs: dict[str, torch.Tensor], policy: ActorCritic | None = None
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample actions; returns (action, log_prob, value, mean, std). The Gaussian's ops are written out (the same
        ops, in the same order, as ``torch.distributions.Normal``: bit-identical samples and log-probs) because the
        distribution object's construction and argument checks cost more than the maths at rollout batch sizes.
        ``policy`` acts instead of the learner (an overlapped rollout's copy of the policy of one update before)."""
        policy = self.policy if policy is None else policy
        x = policy.features(obs)
        mean, std = policy.gaussian(x)
        action = torch.normal(mean, std)
        value = policy.critic(policy.critic_input(obs, x)).squeeze(-1)
        return action, gaussian_log_prob(action, mean, std).sum(-1), value, mean, std

    def update(self, generator: torch.Generator | None = None) -> dict[str, float]:
        cfg, storage = self.cfg, self.storage
        if storage.learner_steps == 0:  # every step was a guide's (JSRL): nothing of the learner's own to learn from
            return {"learner_steps": 0.0, "lr": self.lr_schedule.lr, "action_std": self.policy.log_std.exp().mean().item()}
        if cfg.normalize_advantages:
            storage.advantages = normalized_advantages(storage.advantages, self.sync, storage.mask)
        proximal = {"proximal_log_probs": self._proximal_log_probs(storage)} if cfg.overlap else None
        # every step the learner's own (no JSRL guide): the masked means reduce to sum / count, the same numbers
        # (the mask's where() would keep every entry), without the mask's ops per loss term
        batch = storage.num_steps * storage.num_envs
        unmasked = storage.learner_steps == batch
        # the count as a 0-dim tensor (as mask.sum() would be): the division is the same op, bit for bit
        full_count = torch.tensor(float(batch // cfg.num_minibatches), device=self.device)
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        logged: list[list[torch.Tensor]] = []  # per minibatch; read once at the end (no host round trip per minibatch)
        for mb in storage.minibatches(cfg.num_minibatches, cfg.num_epochs, generator, extra=proximal):
            mask = mb["mask"]  # the learner's own steps (all of them unless a JSRL guide acted)
            keep, count = (None, full_count) if unmasked else (mask > 0, mask.sum().clamp(min=1.0))
            loss, surrogate, value_loss, entropy, kl, clip_fraction = self._losses(mb, keep, count)
            # KL(old || new) of diagonal Gaussians drives the adaptive learning rate
            kl = self._reduce_mean(kl)
            self.lr_schedule.step(kl)

            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self._reduce_gradients()
            nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            self.optimizer.step()
            logged.append([surrogate.detach(), value_loss.detach(), entropy.detach(), kl, clip_fraction])
        # the same float sums as adding each minibatch's .item() in turn
        columns = torch.stack([torch.stack(row) for row in logged]).T.tolist()
        out = {k: sum(column, 0.0) / len(logged)
               for k, column in zip(("policy_loss", "value_loss", "entropy", "kl", "clip_fraction"), columns, strict=True)}
        out["lr"] = self.lr_schedule.lr
        out["action_std"] = self.policy.log_std.exp().mean().item()
        out["learner_steps"] = float(storage.learner_steps)
        return out

    @torch.no_grad()
    def _proximal_log_probs(self, storage: RolloutStorage) -> torch.Tensor:
        """The stored actions' log-probs under the policy this update starts from (decoupled PPO's proximal policy),
        whose Gaussians replace the stored ones for the adaptive lr's KL. An overlapped rollout acted with the policy of
        one update before: the ratio and its clip are taken around this policy, each sample weighted by this policy's
        ratio to the acting one, so the stale samples are importance-corrected and each update has the whole clip
        range and KL budget (around the acting policy the previous update would have spent part of them)."""
        batch = storage.num_steps * storage.num_envs
        obs = {k: v.reshape(batch, *v.shape[2:]) for k, v in storage.obs.items()}
        size = -(-batch // self.cfg.num_minibatches)  # minibatch-sized forward passes (image encoders)
        log_probs = torch.empty(batch, device=self.device)
        actions = storage.actions.view(batch, -1)
        for i in range(0, batch, size):
            mean, std = self.policy.gaussian(self.policy.features({k: v[i:i + size] for k, v in obs.items()}))
            storage.action_mean.view(batch, -1)[i:i + size] = mean
            storage.action_std.view(batch, -1)[i:i + size] = std
            log_probs[i:i + size] = gaussian_log_prob(actions[i:i + size], mean, std).sum(-1)
        return log_probs.view(storage.num_steps, storage.num_envs)

    def _minibatch_losses(self, mb: dict[str, Any], keep: torch.Tensor | None, count: torch.Tensor
                          ) -> tuple[torch.Tensor, ...]:
        """(loss, surrogate, value loss, entropy, KL(old || new), clip fraction) of one minibatch; ``keep`` masks in
        the learner's own steps (None: all of them), ``count`` is their number. What ``--ppo.compile`` compiles."""
        cfg = self.cfg

        def mean_of(v: torch.Tensor) -> torch.Tensor:
            return (v if keep is None else torch.where(keep, v, torch.zeros_like(v))).sum() / count

        # the frames randomly shifted (DrQ) for the update only; the asymmetric critic reads its own observation
        x = self.policy.features(mb["obs"], augment=True)
        mean, std = self.policy.gaussian(x)
        log_prob = gaussian_log_prob(mb["actions"], mean, std).sum(-1)
        entropy = mean_of(gaussian_entropy(std).sum(-1))
        value = self.policy.critic(self.policy.critic_input(mb["obs"], x)).squeeze(-1)
        with torch.no_grad():
            old_mu, old_sigma = mb["action_mean"], mb["action_std"]
            kl = mean_of((torch.log(std / old_sigma) + (old_sigma.square() + (old_mu - mean).square())
                          / (2.0 * std.square()) - 0.5).sum(-1))

        proximal = mb.get("proximal_log_probs")  # overlap: decoupled PPO (see _proximal_log_probs)
        ratio = torch.exp(log_prob - (mb["log_probs"] if proximal is None else proximal))
        adv = mb["advantages"] if proximal is None else mb["advantages"] * torch.exp(proximal - mb["log_probs"])
        surrogate = mean_of(torch.max(-adv * ratio, -adv * ratio.clamp(1.0 - cfg.clip, 1.0 + cfg.clip)))
        clipped = mb["values"] + (value - mb["values"]).clamp(-cfg.value_clip, cfg.value_clip)
        value_loss = mean_of(torch.max((value - mb["returns"]).square(), (clipped - mb["returns"]).square()))
        loss = surrogate + cfg.value_coef * value_loss - cfg.entropy_coef * entropy
        with torch.no_grad():
            clip_fraction = mean_of(((ratio - 1.0).abs() > cfg.clip).float())
        return loss, surrogate, value_loss, entropy, kl, clip_fraction

    # data-parallel training: statistics averaged and gradients all-reduced across ranks
    def _reduce_mean(self, x: torch.Tensor) -> torch.Tensor:
        return self.sync.mean(x) if self.sync else x

    def _reduce_gradients(self) -> None:
        if self.sync:
            self.sync.gradients(self.policy.parameters())


register_algorithm(AlgorithmSpec(
    name="ppo", summary="PPO (RSL-RL-grade) on the MLP Gaussian actor-critic", config_field="ppo", config=PPOConfig,
    policy_kind="actor-critic", runner="rlrobot.runners.on_policy:OnPolicyRunner", run_fields=(JSRLInput,)))
