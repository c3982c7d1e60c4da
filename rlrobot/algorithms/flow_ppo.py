"""Flow-Noise PPO and Flow-SDE PPO (pi_RL) for flow-matching action-chunk policies, top to bottom.

One PPO sample is one action chunk. The "action" whose likelihood PPO needs is the whole denoising chain
x(t=1) -> ... -> x(t=0): every step of it is a Gaussian transition, so the chain's log-likelihood is exact.

* ``flow-noise``: every step draws noise with a learned std (noise head, bounded in [sigma_min, sigma_max]);
  the log-prob of each chunk element is RLinf's joint log-prob (``joint_logprob``): the mean of its K + 1 terms, the
  initial noise's log N(x(t=1); 0, I) and the K transitions' log-densities. The initial term has no parameters, so the
  PPO log-ratio is the K transitions' sum / (K + 1): the scale that PPO's clip and KL target are set for in RLinf.
  The entropy bonus on the noise head averages the same K + 1 Gaussians' entropies over the executed elements.
* ``flow-sde``: the Euler-Maruyama step of the reverse SDE with sigma_t = a * sqrt(t / (1 - t)). ``hybrid`` makes one
  random step per sample stochastic and keeps that step's log-prob (RLinf's ODE-SDE mix); ``full`` makes all steps
  stochastic, with the joint log-prob as flow-noise.

Ratios per chunk (log-probs summed over the executed actions x action dims) or per action element; dual-clip
surrogate; clipped value loss on a value head over the detached observation embedding; GAE over chunks, whose reward
is the sum of their step rewards (time-outs bootstrapped by the runner with V(final_obs)).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from rlrobot.algorithms.ppo import (
    AdaptiveLR,
    clipped_value_loss,
    normalized_advantages,
    validate_overlap,
    validate_ppo_common,
)
from rlrobot.algorithms.registry import AlgorithmConfig, AlgorithmSpec, register_algorithm
from rlrobot.checkpoints import load_config, load_section
from rlrobot.curricula.jump_start import JSRLInput
from rlrobot.data.rollout_storage import RolloutStorage, masked_mean
from rlrobot.domains import NonNegative, NonNegativeInt, Positive, PositiveInt, UnitInterval
from rlrobot.policies.flow import FlowPolicy, gaussian_log_prob
from rlrobot.policies.registry import policy_kind_of

FLOW_VARIANTS = ("noise", "sde")
"""how flow-policy PPO makes the denoising chain stochastic (an algorithm spec's ``flow_variant``)"""
SDE_MODES = ("hybrid", "full")
RATIO_LEVELS = ("chunk", "element")


@dataclass
class InitCheckpoint:
    init: str = ""
    """start from this checkpoint or run directory (an SFT or flow-RL run); 'none' starts from random weights"""


@dataclass
class FlowPPOConfig(AlgorithmConfig):
    rollout_chunks: PositiveInt = 8
    """chunks per env per rollout (each executes flow.execute_steps actions)"""
    num_epochs: PositiveInt = 4
    """passes over each rollout"""
    num_minibatches: PositiveInt = 4
    """minibatches per pass"""
    clip: Positive = 0.2
    """PPO ratio clip epsilon"""
    dual_clip: Positive = 3.0
    """dual-clip bound c: for negative advantages the loss is at most -c A"""
    value_clip: Positive = 0.2
    """clip of the value update around the rollout's values"""
    gamma: UnitInterval = 0.99
    """discount per chunk"""
    lam: UnitInterval = 0.95
    """GAE lambda (over chunks)"""
    value_coef: NonNegative = 1.0
    """weight of the value loss"""
    entropy_coef: NonNegative = 0.005
    """(flow-noise) bonus on the noise head's Gaussian entropy"""
    lr: Positive = 1e-4
    """policy (encoder, velocity network, noise head); the starting value when lr_schedule is adaptive"""
    lr_schedule: Literal["adaptive", "fixed", "linear"] = "adaptive"
    """adaptive: RSL-RL's rule on the policy lr (KL > 2x desired_kl: / 1.5; < desired_kl / 2: x 1.5) | fixed | linear:
    the policy lr x (1 - i / N) in iteration i = 0..N-1"""
    desired_kl: Positive = 0.02
    """per-chunk KL(old || new) target of the adaptive schedule"""
    max_kl: NonNegative = 0.0
    """stop an update's remaining minibatches once the KL(old || new) estimate before a minibatch exceeds this
    (SB3 / CleanRL's target_kl early stop; 0 = off): the adaptive lr reacts only after a destructive step"""
    lr_start: NonNegative = 0.0
    """the adaptive policy lr's value for the first policy update (after the critic warm-up), from which the adaptive
    rule climbs x1.5 per minibatch while the KL stays under desired_kl / 2 (0 = start at lr): a fine-tuned start's
    first step at the full lr can move it far (approx_kl ~11 from a short SFT), before any KL has been measured"""
    lr_min: Positive = 1e-6
    """lower bound of the adaptive lr"""
    lr_max: Positive = 1e-3
    """upper bound of the adaptive lr"""
    value_lr: Positive = 1e-3
    """value head learning rate (fixed)"""
    max_grad_norm: Positive = 1.0
    """gradient-norm clip, applied to the policy and the value head separately"""
    ratio_level: Literal["chunk", "element"] = "chunk"
    """chunk: one ratio per chunk | element: one ratio per action element (same advantage)"""
    sde_mode: Literal["hybrid", "full"] = "hybrid"
    """(flow-sde) hybrid: one random stochastic step per sample | full: every step stochastic"""
    noise_level: Positive = 0.5
    """(flow-sde) a in sigma_t = a * sqrt(t / (1 - t))"""
    critic_warmup_iterations: NonNegativeInt = 0
    """iterations that train only the value head (the SFT checkpoint has none)"""
    normalize_advantages: bool = True
    """advantages to zero mean, unit std per update"""
    freeze_encoder: bool = False
    """train the action expert (velocity network, noise head) and the value head only; the observation encoder
    (instruction tokens, entity attention, state / image encoders: what encode() runs) keeps its --init weights, as
    RL fine-tuning of a VLA often keeps its vision-language backbone"""
    fused_adam: bool = False
    """Adam as one fused kernel over all parameters (CPU / CUDA): the optimizer step ~2.5x faster, the same update up to
    float rounding (not bit-identical to the default, hence opt-in)"""
    compile: bool = False
    """torch.compile the minibatch loss (the chain log-probs, value and surrogate; forward and backward as generated
    kernels; on the CPU it needs a C++ compiler): the same update up to float rounding; the first update pays the
    compile (about a minute on a 2-core CPU), so it pays off in long runs and on GPUs, where it cuts kernel launches"""
    overlap: bool = False
    """collect the next rollout while the update runs (on a second thread): the rollout acts with the policy of one
    update before, whose log-probs the stored chains keep, so the PPO ratio is the exact importance weight of that
    behaviour policy and the clip bounds it (APPO's one-step staleness); the KL (adaptive lr, max_kl) is measured from
    the policy the update starts from. Evaluations, checkpoints and the last iteration wait for the update"""

    def validate(self, run) -> None:
        validate_ppo_common(self, "flow_ppo")
        validate_overlap(self, run, "flow_ppo")
        if self.rollout_chunks < 1:
            raise ValueError(f"flow_ppo.rollout_chunks must be >= 1, got {self.rollout_chunks}")
        if self.sde_mode not in SDE_MODES:
            raise ValueError(f"flow_ppo.sde_mode={self.sde_mode!r} is not one of {SDE_MODES}")
        if self.ratio_level not in RATIO_LEVELS:
            raise ValueError(f"flow_ppo.ratio_level={self.ratio_level!r} is not one of {RATIO_LEVELS}")
        if self.dual_clip <= 1.0:
            raise ValueError(f"flow_ppo.dual_clip must be > 1, got {self.dual_clip}")
        if self.noise_level <= 0:
            raise ValueError(f"flow_ppo.noise_level must be > 0, got {self.noise_level}")
        if not run.init and not run.resume:
            raise ValueError(f"algo={run.algo!r} fine-tunes a flow policy: pass --init CHECKPOINT (e.g. an --algo sft run) "
                             "or --init none to start from random weights")
        if (run.num_envs * self.rollout_chunks) % self.num_minibatches:
            raise ValueError(f"num_envs x flow_ppo.rollout_chunks = {run.num_envs * self.rollout_chunks} must be "
                             f"divisible by flow_ppo.num_minibatches={self.num_minibatches}")

    def env_steps_per_iteration(self, run) -> int:
        return run.num_envs * self.rollout_chunks * (run.flow.execute_steps or run.flow.chunk_size)

    def prepare(self, run) -> None:
        adopt_init_architecture(run)


# flow-policy settings that do not shape the weights: set on this run (differing from the default), they win over
# the --init checkpoint's (Flow-Noise's noise bounds were silently taken from the SFT checkpoint before)
RUN_FLOW_SETTINGS = ("execute_steps", "noise_std_min", "noise_std_max")


def adopt_init_architecture(run) -> None:
    """Fine-tuning starts from the ``--init`` checkpoint: its flow-policy architecture becomes this run's (a
    checkpoint of another policy kind is refused); ``RUN_FLOW_SETTINGS`` given on this run are kept."""
    if run.init in ("", "none") or run.resume:
        return

    saved = load_config(run.init)
    kind = policy_kind_of(saved)
    if kind != "flow":
        raise ValueError(f"init={run.init!r} holds a {kind!r} policy; algo={run.algo!r} fine-tunes a 'flow' policy "
                         "(train one first with --algo sft)")
    init_flow = load_section(saved, "flow", type(run.flow))
    defaults = type(run.flow)()
    for name in RUN_FLOW_SETTINGS:
        if getattr(run.flow, name) != getattr(defaults, name):
            setattr(init_flow, name, getattr(run.flow, name))
    run.flow = init_flow


class FlowPPO:
    def __init__(self, policy: FlowPolicy, cfg: FlowPPOConfig, variant: str, device: torch.device, num_envs: int,
                 obs_specs: dict[str, tuple[tuple[int, ...], torch.dtype]], sync=None):
        if variant not in FLOW_VARIANTS:
            raise ValueError(f"variant={variant!r} is not one of {FLOW_VARIANTS}")
        self.policy, self.cfg, self.device = policy, cfg, device
        self.sync = sync  # data-parallel reductions (rlrobot.runners.distributed); None in one process
        self.mode = variant
        self.executed_dim = policy.execute_steps * policy.action_dim  # log-probs cover the executed part of the chunk
        value_params = list(policy.value_parameters())
        ids = {id(p) for p in value_params}
        policy_params = [p for p in policy.parameters() if id(p) not in ids]
        if cfg.freeze_encoder:
            if not hasattr(policy, "encoder_parameters"):
                raise ValueError(f"flow_ppo.freeze_encoder: the policy ({type(policy).__name__}) does not name its "
                                 "observation encoder's parameters (encoder_parameters())")
            encoder = {id(p) for p in policy.encoder_parameters()}
            policy_params = [p for p in policy_params if id(p) not in encoder]
        fused = {"fused": True} if cfg.fused_adam and device.type in ("cpu", "cuda") else {}
        self.optimizer = torch.optim.Adam([{"params": policy_params, "lr": cfg.lr},
                                           {"params": value_params, "lr": cfg.value_lr}], **fused)
        self._losses = torch.compile(self._minibatch_losses) if cfg.compile else self._minibatch_losses
        # clipped apart: the value head sees a detached embedding, and its large early gradients must not shrink
        # the policy's step through a shared norm
        self.param_groups = (policy_params, value_params)
        self.lr_schedule = AdaptiveLR(cfg, self.optimizer, groups=(0,))  # the policy's lr; the value lr is fixed
        if cfg.lr_start and cfg.lr_schedule == "adaptive":
            self.lr_schedule.start_at(cfg.lr_start)
        self.iterations = 0
        self.storage = RolloutStorage(cfg.rollout_chunks, num_envs, obs_specs, {
            "chains": ((policy.denoising_steps + 1, policy.flat_dim), torch.float32),
            "steps": ((self.num_logged_steps,), torch.long),
            "log_probs": ((self.executed_dim,), torch.float32)}, device)

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "lr": self.lr_schedule.lr, "iterations": self.iterations}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.lr_schedule.lr, self.iterations = state["lr"], state["iterations"]

    def begin_iteration(self, iteration: int, total_iterations: int) -> None:
        """Called by the runner before each update: the linear lr schedule's step."""
        self.lr_schedule.begin_iteration(iteration, total_iterations)

    @property
    def num_logged_steps(self) -> int:
        return 1 if self.mode == "sde" and self.cfg.sde_mode == "hybrid" else self.policy.denoising_steps

    def stochastic_steps(self, batch: int, generator: torch.Generator | None) -> torch.Tensor:
        """Indices [B, S] of the denoising steps that draw noise (and whose log-probs PPO uses)."""
        k = self.policy.denoising_steps
        if self.num_logged_steps == 1:
            return torch.randint(k, (batch, 1), device=self.device, generator=generator)
        return torch.arange(k, device=self.device).expand(batch, k)

    @torch.no_grad()
    def act(self, obs: dict[str, torch.Tensor], generator: torch.Generator | None = None, policy: FlowPolicy | None = None
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample chunks: returns (actions [B, H, A], chain, steps, per-element log-probs [B, E*A], value). ``policy``
        acts instead of the learner (an overlapped rollout's copy of the policy of one update before)."""
        policy = self.policy if policy is None else policy
        emb = policy.encode(obs)
        batch = emb.shape[0]
        steps = self.stochastic_steps(batch, generator)
        mask = torch.zeros(batch, policy.denoising_steps, dtype=torch.bool, device=self.device)
        mask.scatter_(1, steps, True)
        chain, step_log_probs = policy.sample_chain(obs, self.mode, self.cfg.noise_level, mask, generator, emb=emb)
        log_probs = step_log_probs.gather(1, steps[:, :, None].expand(-1, -1, step_log_probs.shape[-1]))
        actions = policy.chain_actions(chain[:, -1])
        return actions, chain, steps, self.chunk_log_probs(chain, log_probs), policy.value_from_embedding(emb)

    def chunk_log_probs(self, chain: torch.Tensor, step_log_probs: torch.Tensor) -> torch.Tensor:
        """Per executed element [B, E*A]: the logged step's log-density (one stochastic step), or the mean of the
        initial noise's and the K steps' log-densities (RLinf's joint log-prob, all steps stochastic)."""
        step_log_probs = step_log_probs[:, :, :self.executed_dim]
        if self.num_logged_steps == 1:
            return step_log_probs[:, 0]
        initial = chain[:, 0, :self.executed_dim]
        initial = gaussian_log_prob(initial, torch.zeros_like(initial), torch.ones_like(initial))
        return (initial + step_log_probs.sum(1)) / (step_log_probs.shape[1] + 1)

    def rollout_act(self, obs: dict[str, torch.Tensor], generator: torch.Generator | None = None,
                    policy: FlowPolicy | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
        """What the rollout needs: (actions [B, H, A], fields to store, value [B]); ``policy`` as in ``act``."""
        actions, chain, steps, log_probs, value = self.act(obs, generator, policy)
        return actions, {"chains": chain, "steps": steps, "log_probs": log_probs}, value

    def evaluate_chain(self, obs, chain, steps) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-element log-probs [B, E*A] of stored chains under the current parameters, entropy, value."""
        log_probs, std, emb = self.policy.chain_log_prob(obs, chain, steps, self.mode, self.cfg.noise_level)
        # the initial noise's entropy (std 1) joins the steps' as in the joint log-prob; constant, it only sets the scale
        step_entropy = (0.5 * torch.log(2 * torch.pi * torch.e * std[:, :, :self.executed_dim].square())).mean((0, 2))
        initial_entropy = 0.5 * torch.log(torch.tensor(2 * torch.pi * torch.e, device=std.device))
        entropy = (initial_entropy + step_entropy.sum()) / (len(step_entropy) + 1)
        return self.chunk_log_probs(chain, log_probs), entropy, self.policy.value_from_embedding(emb)

    def update(self, generator: torch.Generator | None = None) -> dict[str, float]:
        cfg, storage = self.cfg, self.storage
        if storage.learner_steps == 0:  # every chunk was a JSRL guide's: nothing of the learner's own to learn from
            return {"learner_steps": 0.0, "lr": self.lr_schedule.lr}
        if cfg.normalize_advantages:
            storage.advantages = normalized_advantages(storage.advantages, self.sync, storage.mask)
        warmup = self.iterations < cfg.critic_warmup_iterations
        logged: list[list[torch.Tensor]] = []  # per minibatch; read once at the end (no host round trip per minibatch)
        first_deviation: torch.Tensor | None = None
        stopped_at: torch.Tensor | None = None
        proximal = {"proximal_log_probs": self._log_probs_from_here(storage)} if cfg.overlap else None
        for mb in storage.minibatches(cfg.num_minibatches, cfg.num_epochs, generator, extra=proximal):
            loss, surrogate, value_loss, entropy, kl, deviation, clip_fraction = self._losses(mb, warmup)
            kl = self._reduce_mean(kl)
            if not warmup and cfg.max_kl and float(kl) > cfg.max_kl:
                stopped_at = kl
                break
            if not warmup:
                self.lr_schedule.step(kl)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self._reduce_gradients()
            for params in self.param_groups:
                nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            self.optimizer.step()
            if first_deviation is None:  # parameters were still the rollout's: every ratio must be 1 (a check)
                first_deviation = deviation
            logged.append([surrogate.detach(), value_loss.detach(), entropy.detach(), kl, clip_fraction])
        self.iterations += 1
        # the same float sums as adding each minibatch's .item() in turn
        columns = torch.stack([torch.stack(row) for row in logged]).T.tolist() if logged else [[]] * 5
        n = max(len(logged), 1)  # an early stop before the first step
        out = {k: sum(column, 0.0) / n
               for k, column in zip(("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction"), columns, strict=True)}
        kls = columns[3] + ([float(stopped_at)] if stopped_at is not None else [])
        out["approx_kl_max"] = max(kls, default=0.0)
        out["first_ratio_max_deviation"] = float(first_deviation) if first_deviation is not None else 0.0
        out["kl_early_stop"] = float(stopped_at is not None)
        out["critic_warmup"] = float(warmup)
        out["lr"] = self.lr_schedule.lr
        out["learner_steps"] = float(storage.learner_steps)
        return out

    @torch.no_grad()
    def _log_probs_from_here(self, storage: RolloutStorage) -> torch.Tensor:
        """The stored chains' log-probs under the policy this update starts from (shaped like ``storage.log_probs``):
        the proximal policy of an overlapped run's decoupled ratio, as in PPO (its rollout's policy is one update older)."""
        flat = lambda x: x.reshape(-1, *x.shape[2:])  # noqa: E731
        obs, chains, steps = {k: flat(v) for k, v in storage.obs.items()}, flat(storage.chains), flat(storage.steps)
        size = -(-chains.shape[0] // self.cfg.num_minibatches)
        parts = [self.evaluate_chain({k: v[i:i + size] for k, v in obs.items()}, chains[i:i + size], steps[i:i + size])[0]
                 for i in range(0, chains.shape[0], size)]
        return torch.cat(parts).view_as(storage.log_probs)

    def _minibatch_losses(self, mb: dict[str, Any], warmup: bool) -> tuple[torch.Tensor, ...]:
        """(loss, surrogate, value loss, entropy, KL(old || new) before this minibatch's step, max |ratio - 1|, clip
        fraction) of one minibatch: what ``--flow-ppo.compile`` compiles."""
        cfg = self.cfg
        mask = mb["mask"]  # the learner's own chunks (JSRL: chunks begun by the guide are not credited)
        log_probs, entropy, value = self.evaluate_chain(mb["obs"], mb["chains"], mb["steps"])
        adv = mb["advantages"]
        if cfg.ratio_level == "chunk":
            log_ratio = (log_probs - mb["log_probs"]).sum(-1)
        else:
            log_ratio = log_probs - mb["log_probs"]
            adv = adv[:, None].expand_as(log_ratio)
        if "proximal_log_probs" in mb:  # overlap: decoupled PPO, as PPO's (ratio and clip around the update's start,
            stale = mb["proximal_log_probs"] - mb["log_probs"]  # weighted by its ratio to the acting policy)
            stale = stale.sum(-1) if log_ratio.dim() == 1 else stale
            log_ratio, adv = log_ratio - stale, adv * stale.exp()
        ratio = torch.exp(log_ratio)
        with torch.no_grad():
            # k3 estimate of KL(old || new) per chunk, before this minibatch's step (Schulman's approximation)
            chunk_log_ratio = log_ratio if log_ratio.dim() == 1 else log_ratio.sum(-1)
            kl = masked_mean((chunk_log_ratio.exp() - 1) - chunk_log_ratio, mask)
        surrogate = torch.max(-adv * ratio, -adv * ratio.clamp(1.0 - cfg.clip, 1.0 + cfg.clip))
        # dual clip: for negative advantages bound the loss by -c * A (a huge ratio cannot dominate the batch)
        surrogate = masked_mean(torch.where(adv < 0, torch.min(surrogate, -cfg.dual_clip * adv), surrogate), mask)
        value_loss = clipped_value_loss(value, mb["values"], mb["returns"], cfg.value_clip, mask)
        loss = cfg.value_coef * value_loss
        if not warmup:
            loss = loss + surrogate
            if self.mode == "noise":
                loss = loss - cfg.entropy_coef * entropy
        with torch.no_grad():
            deviation = (ratio - 1.0).abs().max()
            clip_fraction = masked_mean(((ratio - 1.0).abs() > cfg.clip).float(), mask)
        return loss, surrogate, value_loss, entropy, kl, deviation, clip_fraction

    # data-parallel training: statistics averaged and gradients all-reduced across ranks
    def _reduce_mean(self, x: torch.Tensor) -> torch.Tensor:
        return self.sync.mean(x) if self.sync else x

    def _reduce_gradients(self) -> None:
        if self.sync:
            self.sync.gradients(self.policy.parameters())


def chain_log_likelihood(policy: FlowPolicy, obs: dict[str, torch.Tensor], chain: torch.Tensor, mode: str,
                         noise_level: float = 0.5) -> torch.Tensor:
    """Exact log-likelihood of full stochastic chains [B, K + 1, D]: log N(x(t=1); 0, I) + sum_k log N(x_{k+1}; mu_k,
    sigma_k^2), summed over elements -> [B]."""
    k = policy.denoising_steps
    steps = torch.arange(k, device=chain.device).expand(len(chain), k)
    log_probs, _, _ = policy.chain_log_prob(obs, chain, steps, mode, noise_level)
    initial = gaussian_log_prob(chain[:, 0], torch.zeros_like(chain[:, 0]), torch.ones_like(chain[:, 0]))
    return initial.sum(-1) + log_probs.sum((1, 2))


for _variant, _what in (("noise", "Flow-Noise PPO (pi_RL): learned per-step noise, exact chain log-probs"),
                        ("sde", "Flow-SDE PPO (pi_RL): reverse-SDE denoising steps, exact chain log-probs")):
    register_algorithm(AlgorithmSpec(
        name=f"flow-{_variant}", summary=_what + " (fine-tunes --init)", config_field="flow_ppo", config=FlowPPOConfig,
        policy_kind="flow", runner="rlrobot.runners.flow_on_policy:FlowOnPolicyRunner",
        run_fields=(InitCheckpoint, JSRLInput), flow_variant=_variant))
