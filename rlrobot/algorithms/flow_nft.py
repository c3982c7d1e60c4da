"""Flow-NFT: forward-process RL for flow-matching action-chunk policies (DiffusionNFT, arXiv 2509.16117), top to bottom.

Flow-Noise / Flow-SDE PPO need the likelihood of the denoising chain, hence stochastic denoising steps, a noise head
or an SDE, and the chain stored per sample. NFT needs none of that: it samples chunks with any solver, scores them, and
trains with a flow-matching loss on the *forward* (noising) process of the executed chunks.

Symbols (the paper's, in openpi's time convention: t = 1 noise, t = 0 the chunk):
  a          a chunk sampled by the rollout (sampler) policy, flattened [H*A]
  x_t        = t * eps + (1 - t) * a,  eps ~ N(0, I),  t ~ U(0, 1) (fresh noise and time, not the sampling chain)
  u          = eps - a, the flow-matching target velocity
  v_theta    the velocity network being trained;  v_old the reference ("old") policy, a slowly updated copy
  beta       the implicit-policy step:  v+ = (1 - beta) v_old + beta v_theta,   v- = (1 + beta) v_old - beta v_theta
  A          the chunk's advantage (GAE over chunks with the value head, as flow-policy PPO), normalised to zero mean
             and unit std over the rollout
  r          optimality in [0, 1]:  r = clip(A / c, -1, 1) / 2 + 1/2  (c = ``adv_clip``); r = 1/2 is neutral
  L(theta)   = E_{a, t, eps} [ c / beta * ( r * w+ ||v+ - u||^2 + (1 - r) * w- ||v- - u||^2 ) ]
             + lambda_anchor * E ||v_theta - v_sft||^2          (CRD-style drift control toward the --init policy)

Why it improves the policy: the minimiser of the r-weighted positive term is the velocity of the data distribution
re-weighted by r, so v+ moves toward good chunks; the negative term's minimiser is the (1 - r)-weighted one, and v- is
v+ mirrored around v_old, so both push v_theta the same way (toward r-weighted, away from (1 - r)-weighted chunks).
With r = 1/2 everywhere the two terms cancel: the gradient is 2 beta^2 (v_theta - v_old), zero while theta = theta_old.
With r = 1 and beta = 1 the loss is plain flow matching toward the sampled chunks.

``weighting``: ``adaptive`` divides each sample's squared error by its detached mean absolute error (the paper's
adaptive loss weight, which makes the loss scale-free across t; it measures the error in x0-space, where
x0_hat - a = t (u - v), so the weight is t * mean|u - v|); ``none`` is the plain velocity-space MSE.

MeanFlowNFT: with ``--flow.mean-flow`` the policy predicts the average velocity u(x_t, r, t) over [r, t] and samples
a chunk in 1-2 steps; v_theta, v_old and the anchor above are then the instantaneous velocities their u induce,
V = u(x_t, r, t) + (t - r) sg(du/dt) (MeanFlow's identity with du/dt along the policy's own velocity), on intervals
r <= t drawn as in SFT, so NFT fine-tunes every interval the sampler jumps.

Choices made here (the paper is about images; say so where it differs): one sample per observation (no group of
rollouts from the same start state: the VecEnv resets envs independently), so r comes from the critic's GAE
advantages rather than group-normalised rewards; only the executed part of each chunk enters the loss (the rest was
never scored); the reference policy is updated after every iteration by a soft update theta_old <- eta theta_old +
(1 - eta) theta with eta = min(ref_ema_ramp * iteration, ref_ema_max) (the paper's growing-EMA schedule; 0 / 0 = a
hard copy, i.e. on-policy); the rollout samples with the reference policy v_old (the paper's sampler, which is the
current policy under the hard copy) by its ODE from random initial noise (any solver works: ``sampler=noise`` adds
Flow-Noise steps for more exploration). The value head trains as in flow-policy PPO.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import torch
from torch import nn

from rlrobot.algorithms.flow_ppo import InitCheckpoint, adopt_init_architecture
from rlrobot.algorithms.ppo import clipped_value_loss, normalized_advantages
from rlrobot.algorithms.registry import AlgorithmConfig, AlgorithmSpec, register_algorithm
from rlrobot.algorithms.sft import TIME_SAMPLING, sample_time
from rlrobot.curricula.execute_length import PolicyTrimInput
from rlrobot.data.rollout_storage import RolloutStorage
from rlrobot.domains import Domain, NonNegative, NonNegativeInt, Positive, PositiveInt, PositiveUnit, UnitInterval
from rlrobot.policies.flow import FlowPolicy
from rlrobot.tasks.registry import is_adapter_task

SAMPLERS = ("ode", "noise")
OPTIMALITY = ("gae", "group")
GROUP_SCORES = ("return", "success", "success-steps")
WEIGHTINGS = ("adaptive", "none")


@dataclass
class FlowNFTConfig(AlgorithmConfig):
    rollout_chunks: PositiveInt = 8
    """chunks per env per rollout (each executes flow.execute_steps actions)"""
    num_epochs: PositiveInt = 4
    """passes over each rollout"""
    num_minibatches: PositiveInt = 4
    """minibatches per pass"""
    times_per_sample: PositiveInt = 2
    """fresh (t, eps) draws per chunk in each minibatch (the paper trains on several times per sample)"""
    antithetic: bool = False
    """draw the (t, eps) of each chunk in antithetic pairs (t, eps) and (t, -eps) (times_per_sample even): the same
    expected loss, with the part of the gradient that is eps noise, not the chunk's optimality, cancelled to first
    order (one sample per observation leaves that noise large against the exploration signal)"""
    paired_baseline: bool = False
    """a control variate for one sample per observation: beside each stored chunk a, a fresh chunk a' from the
    reference policy at the same observation (the rollout's sampler), on the same (t, eps), with the mirrored
    optimality 1 - r. At theta = theta_old the pair's gradient is (2r - 1)(u' - u) = (2r - 1)(a - a'): what
    distinguishes the executed chunk from a typical own sample, while the part common to both (the eps noise and the
    flow-matching pull of the policy's own samples, whose weight 2r - 1 leaks the critic's per-state error) cancels.
    Unbiased wherever the advantage has zero mean over the policy's chunks at each observation, as GAE's should"""
    optimality: Literal["gae", "group"] = "gae"
    """where r comes from: gae (per-chunk GAE advantage from the value head) | group (whole episodes from shared start
    states, scored by episode outcome and normalised within their group; no critic)"""
    group_size: PositiveInt = 8
    """(group) envs that share one start state; num_envs must be a multiple"""
    group_score: Literal["return", "success", "success-steps"] = "return"
    """(group) the episode outcome: return (dense) | success | success-steps (PolicyTrim's step-efficiency reward:
    success + step_bonus * (1 - first-success step / episode length), the bonus only where the group's success rate
    >= reproducible_rate, so a fast success that its group does not reproduce earns nothing extra)"""
    step_bonus: NonNegative = 0.5
    """(success-steps) weight of the speed bonus"""
    reproducible_rate: UnitInterval = 0.5
    """(success-steps) group success rate from which the speed bonus counts"""
    max_drift: NonNegative = 0.0
    """clip |v_theta - v_old| elementwise at this value inside the loss (a trust region; 0 = off)"""
    beta: PositiveUnit = 1.0
    """implicit-policy step beta: v+ = (1 - beta) v_old + beta v_theta, v- = (1 + beta) v_old - beta v_theta"""
    adv_clip: Positive = 2.0
    """c: r = clip(A / c, -1, 1) / 2 + 1/2 on normalised advantages; the loss is scaled by c"""
    weighting: Literal["adaptive", "none"] = "adaptive"
    """adaptive: divide each sample's error by its detached mean |error| (the paper) | none: plain MSE"""
    time_sampling: Literal["beta", "uniform"] = "uniform"
    """flow time of the loss: uniform | beta (pi0's Beta(1.5, 1), as SFT)"""
    ref_ema_ramp: NonNegative = 0.0
    """reference-policy soft update eta = min(ref_ema_ramp * iteration, ref_ema_max); 0 = hard copy every iteration"""
    ref_ema_max: Annotated[float, Domain(0.0, 1.0, high_open=True)] = 0.0
    """upper bound of the reference EMA eta"""
    anchor_coef: NonNegative = 0.0
    """weight of ||v_theta - v_init||^2 on the same noisy chunks (drift control toward the --init policy)"""
    denoising_steps: NonNegativeInt = 0
    """K of the fine-tuned policy (rollouts, evaluation, the saved policy); 0 = the --init checkpoint's. NFT trains on
    the forward process, so any K works, e.g. 1-2 for fast deployment"""
    sampler: Literal["ode", "noise"] = "ode"
    """rollout solver: ode from random initial noise | noise (Flow-Noise steps with the noise head's std)"""
    gamma: UnitInterval = 0.99
    """discount per chunk"""
    lam: UnitInterval = 0.95
    """GAE lambda (over chunks)"""
    lr: Positive = 3e-5
    """policy learning rate (Adam, fixed)"""
    value_lr: Positive = 1e-3
    """value head learning rate"""
    value_clip: Positive = 0.2
    """clip of the value update around the rollout's values"""
    max_grad_norm: Positive = 1.0
    """gradient-norm clip, policy and value head separately"""
    critic_warmup_iterations: NonNegativeInt = 0
    """iterations that train only the value head (an SFT checkpoint has none)"""
    fused_adam: bool = False
    """Adam as one fused kernel over all parameters (CPU / CUDA): the optimizer step ~2.5x faster, the same update up to
    float rounding (not bit-identical to the default, hence opt-in)"""

    def validate(self, run) -> None:
        if self.optimality not in OPTIMALITY:
            raise ValueError(f"flow_nft.optimality={self.optimality!r} is not one of {OPTIMALITY}")
        if self.group_score not in GROUP_SCORES:
            raise ValueError(f"flow_nft.group_score={self.group_score!r} is not one of {GROUP_SCORES}")
        if self.step_bonus < 0 or not 0 <= self.reproducible_rate <= 1:
            raise ValueError(f"flow_nft.step_bonus must be >= 0 and flow_nft.reproducible_rate in [0, 1], got "
                             f"{self.step_bonus} / {self.reproducible_rate}")
        if self.max_drift < 0:
            raise ValueError(f"flow_nft.max_drift must be >= 0 (0 = off), got {self.max_drift}")
        if self.optimality == "group":
            self._validate_group(run)
        if self.denoising_steps < 0:
            raise ValueError(f"flow_nft.denoising_steps must be >= 0 (0 = the --init checkpoint's K), got {self.denoising_steps}")
        for name in ("rollout_chunks", "times_per_sample", "num_epochs", "num_minibatches"):
            if getattr(self, name) < 1:
                raise ValueError(f"flow_nft.{name} must be >= 1, got {getattr(self, name)}")
        if self.antithetic and self.times_per_sample % 2:
            raise ValueError(f"flow_nft.antithetic pairs the draws: flow_nft.times_per_sample must be even, got "
                             f"{self.times_per_sample}")
        if not 0 < self.beta <= 1:
            raise ValueError(f"flow_nft.beta must be in (0, 1], got {self.beta}")
        if self.adv_clip <= 0:
            raise ValueError(f"flow_nft.adv_clip must be > 0, got {self.adv_clip}")
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"flow_nft.weighting={self.weighting!r} is not one of {WEIGHTINGS}")
        if self.time_sampling not in TIME_SAMPLING:
            raise ValueError(f"flow_nft.time_sampling={self.time_sampling!r} is not one of {TIME_SAMPLING}")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"flow_nft.sampler={self.sampler!r} is not one of {SAMPLERS}")
        if not (0 <= self.ref_ema_max < 1 and self.ref_ema_ramp >= 0):
            raise ValueError(f"flow_nft.ref_ema_max must be in [0, 1) and ref_ema_ramp >= 0, got {self.ref_ema_max} / "
                             f"{self.ref_ema_ramp}")
        if self.anchor_coef < 0 or self.lr <= 0 or self.value_lr <= 0:
            raise ValueError("flow_nft.anchor_coef must be >= 0 and flow_nft.lr / value_lr > 0")
        if not 0.0 <= self.gamma <= 1.0 or not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"flow_nft.gamma and flow_nft.lam must be in [0, 1], got {self.gamma} and {self.lam}")
        if not run.init and not run.resume:
            raise ValueError(f"algo={run.algo!r} fine-tunes a flow policy: pass --init CHECKPOINT (e.g. an --algo sft run) "
                             "or --init none to start from random weights")
        if (run.num_envs * self.rollout_chunks) % self.num_minibatches:
            raise ValueError(f"num_envs x flow_nft.rollout_chunks = {run.num_envs * self.rollout_chunks} must be "
                             f"divisible by flow_nft.num_minibatches={self.num_minibatches}")

    def _validate_group(self, run) -> None:
        if is_adapter_task(run.task):
            raise ValueError(f"flow_nft.optimality='group' copies start states between envs, which needs a native task "
                             f"(get_state / set_state); task={run.task!r} is not one")
        if self.group_size < 2 or run.num_envs % self.group_size:
            raise ValueError(f"flow_nft.group_size={self.group_size} must be >= 2 and divide num_envs={run.num_envs}")
        episode = run.episode_steps()
        execute = run.flow.execute_steps or run.flow.chunk_size
        if episode and self.rollout_chunks * execute != episode:
            raise ValueError(f"flow_nft.optimality='group' scores whole episodes: flow_nft.rollout_chunks x "
                             f"flow.execute_steps = {self.rollout_chunks} x {execute} must equal the episode length "
                             f"{episode} (set flow_nft.rollout_chunks={episode // execute} if it divides)")

    def env_steps_per_iteration(self, run) -> int:
        return run.num_envs * self.rollout_chunks * (run.flow.execute_steps or run.flow.chunk_size)

    def prepare(self, run) -> None:
        adopt_init_architecture(run)
        if self.denoising_steps:
            run.flow.denoising_steps = self.denoising_steps


def group_advantages(scores: torch.Tensor, group_size: int, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Episode scores [N] (envs in consecutive groups that shared a start state) -> (score - group mean) / std, with
    the std over the whole batch (DiffusionNFT's global-std option: tiny differences inside a group of near-equal
    outcomes are not blown up to +-1). Invalid episodes (``valid`` False) get 0 and do not enter the statistics."""
    valid = torch.ones_like(scores, dtype=torch.bool) if valid is None else valid
    grouped = scores.reshape(-1, group_size)
    weights = valid.reshape(-1, group_size).float()
    count = weights.sum(-1, keepdim=True).clamp_min(1.0)
    mean = (grouped * weights).sum(-1, keepdim=True) / count
    centred = (grouped - mean) * weights
    std = centred.square().sum().div(weights.sum().clamp_min(1.0)).sqrt().clamp_min(1e-6)
    return (centred / std).reshape(-1)


def step_efficiency_scores(success: torch.Tensor, first_success_step: torch.Tensor, episode_steps: int, group_size: int,
                           step_bonus: float, reproducible_rate: float) -> torch.Tensor:
    """PolicyTrim's redundancy-aware outcome per episode [N]: 1 for a success, plus ``step_bonus`` x the share of the
    episode left after the first success, that bonus only in groups (shared start state) whose success rate is at least
    ``reproducible_rate``; failures score 0."""
    success = success.float()
    rate = success.reshape(-1, group_size).mean(-1).repeat_interleave(group_size)
    speed = (1.0 - first_success_step.float() / episode_steps).clamp(0.0, 1.0)
    return success * (1.0 + step_bonus * speed * (rate >= reproducible_rate).float())


def optimality(advantages: torch.Tensor, adv_clip: float) -> torch.Tensor:
    """r = clip(A / c, -1, 1) / 2 + 1/2 in [0, 1]."""
    return (advantages / adv_clip).clamp(-1.0, 1.0) * 0.5 + 0.5


def nft_loss(v_theta: torch.Tensor, v_old: torch.Tensor, target: torch.Tensor, r: torch.Tensor, beta: float,
             times: torch.Tensor, weighting: str = "adaptive", mask: torch.Tensor | None = None,
             max_drift: float = 0.0) -> torch.Tensor:
    """Per-sample NFT loss [B] (before the c scale): (r w+ ||v+ - u||^2 + (1 - r) w- ||v- - u||^2) / beta.

    ``v_theta``, ``v_old``, ``target`` are [B, D]; ``r`` [B]; ``times`` [B] (for the adaptive weight's x0-space scale);
    ``mask`` [B, D] selects the elements that count (the executed part of a chunk); ``max_drift`` > 0 clips
    v_theta - v_old elementwise (no gradient beyond the clip, as PPO's ratio clip)."""
    v_old = v_old.detach()
    if max_drift > 0:
        v_theta = v_old + (v_theta - v_old).clamp(-max_drift, max_drift)
    positive = (1.0 - beta) * v_old + beta * v_theta
    negative = (1.0 + beta) * v_old - beta * v_theta
    m = torch.ones_like(target) if mask is None else mask.to(target.dtype)
    count = m.sum(-1).clamp_min(1.0)

    def term(v: torch.Tensor) -> torch.Tensor:
        err = v - target
        loss = (err.square() * m).sum(-1) / count
        if weighting == "adaptive":  # x0-space error t * |u - v|, its detached mean as the weight (paper's adaptive loss)
            scale = (times.detach()[:, None] * err.detach().abs() * m).sum(-1) / count
            loss = loss * times.detach().square() / scale.clamp_min(1e-5)
        return loss

    return (r * term(positive) + (1.0 - r) * term(negative)) / beta


class FlowNFT:
    def __init__(self, policy: FlowPolicy, cfg: FlowNFTConfig, device: torch.device, num_envs: int,
                 obs_specs: dict[str, tuple[tuple[int, ...], torch.dtype]], sync=None):
        self.policy, self.cfg, self.device, self.sync = policy, cfg, device, sync
        # the reference (old) policy and the anchor are frozen copies; the anchor is the --init policy
        self.reference = copy.deepcopy(policy).requires_grad_(False).eval()
        self.anchor = copy.deepcopy(policy).requires_grad_(False).eval() if cfg.anchor_coef > 0 else None
        value_params = list(policy.value_parameters())
        ids = {id(p) for p in value_params}
        noise_ids = {id(p) for p in policy.parameters()} - {id(p) for p in policy.flow_matching_parameters()} - ids
        self.policy_params = [p for p in policy.parameters() if id(p) not in ids and id(p) not in noise_ids]
        self.value_params = value_params
        fused = {"fused": True} if cfg.fused_adam and device.type in ("cpu", "cuda") else {}
        self.optimizer = torch.optim.Adam([{"params": self.policy_params, "lr": cfg.lr},
                                           {"params": value_params, "lr": cfg.value_lr}], **fused)
        self.iterations = 0
        self.set_execute_steps(policy.execute_steps)
        self.storage = RolloutStorage(cfg.rollout_chunks, num_envs, obs_specs,
                                      {"chunks": ((policy.flat_dim,), torch.float32)}, device)

    def set_execute_steps(self, execute_steps: int) -> None:
        """Only the executed actions of a chunk were scored, so only they enter the loss (PolicyTrim grows this)."""
        policy = self.policy
        mask = torch.zeros(policy.chunk_size, policy.action_dim, dtype=torch.bool, device=self.device)
        mask[:execute_steps] = True
        self.executed_mask = mask.reshape(-1)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        state = {"optimizer": self.optimizer.state_dict(), "iterations": self.iterations,
                 "reference": self.reference.state_dict()}
        if self.anchor is not None:
            state["anchor"] = self.anchor.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.iterations = state["iterations"]
        self.reference.load_state_dict(state["reference"])
        if self.anchor is not None and "anchor" in state:
            self.anchor.load_state_dict(state["anchor"])

    def begin_iteration(self, iteration: int, total_iterations: int) -> None:
        """Called by the runner before each update; Flow-NFT's lr is fixed (flow_nft.lr), so nothing changes."""

    # ------------------------------------------------------------------ rollout
    @torch.no_grad()
    def rollout_act(self, obs: dict[str, torch.Tensor], generator: torch.Generator | None = None,
                    policy: FlowPolicy | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
        """Sample chunks with any solver from the reference policy v_old (the current policy while the reference is a
        hard copy): (actions [B, H, A], fields to store, the current value head's value [B]). ``policy`` stands for
        the current policy (the runners' common signature; NFT's rollouts act with the learner itself)."""
        policy = self.policy if policy is None else policy
        emb = policy.encode(obs)
        sampler, sampler_emb = (self.reference, self.reference.encode(obs)) if self.cfg.ref_ema_max > 0 else (policy, emb)
        chain, _ = sampler.sample_chain(obs, self.cfg.sampler, emb=sampler_emb, generator=generator)
        chunk = chain[:, -1]
        return policy.chain_actions(chunk), {"chunks": chunk}, policy.value_from_embedding(emb)

    # ------------------------------------------------------------------ update
    def ref_ema(self) -> float:
        return min(self.cfg.ref_ema_ramp * self.iterations, self.cfg.ref_ema_max)

    def loss(self, obs: dict[str, torch.Tensor], chunks: torch.Tensor, r: torch.Tensor,
             generator: torch.Generator | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """NFT loss on ``times_per_sample`` fresh (t, eps) draws per chunk, plus the anchor term; statistics as 0-dim
        tensors (read once per update, not once per minibatch)."""
        cfg, policy = self.cfg, self.policy
        n = cfg.times_per_sample
        emb = policy.encode(obs).repeat(n, 1)
        with torch.no_grad():
            ref_emb = self.reference.encode(obs).repeat(n, 1)
        a = chunks.repeat(n, 1)
        if cfg.antithetic:  # copy k and copy k + n/2 hold the same chunk: give them the same t and opposite eps
            half = len(a) // 2
            t = sample_time(half, cfg.time_sampling, generator, self.device).repeat(2)
            eps = torch.randn((half, a.shape[1]), generator=generator, device=self.device)
            eps = torch.cat([eps, -eps])
        else:
            t = sample_time(len(a), cfg.time_sampling, generator, self.device)
            eps = torch.randn(a.shape, generator=generator, device=self.device)
        r = r.repeat(n)
        if cfg.paired_baseline:  # a fresh own chunk per draw, same (t, eps), mirrored optimality
            with torch.no_grad():
                chain, _ = self.reference.sample_chain(obs, cfg.sampler, emb=ref_emb[:len(chunks)], generator=generator)
            a = torch.cat([a, chain[:, -1].repeat(n, 1)])
            t, eps, r = t.repeat(2), eps.repeat(2, 1), torch.cat([r, 1.0 - r])
            emb, ref_emb = emb.repeat(2, 1), ref_emb.repeat(2, 1)
        x_t = t[:, None] * eps + (1.0 - t[:, None]) * a
        r_start = policy.interval_starts(t, generator)  # MeanFlow head: NFT acts on the velocity u induces on [r, t]
        v_theta = policy.training_velocity(x_t, t, emb, r_start)
        with torch.no_grad():
            v_old = self.reference.training_velocity(x_t, t, ref_emb, r_start)
        mask = self.executed_mask.expand_as(a)
        per_sample = nft_loss(v_theta, v_old, eps - a, r, cfg.beta, t, cfg.weighting, mask, cfg.max_drift)
        # a pair counts as one sample
        loss = cfg.adv_clip * (per_sample.sum() / (n * len(chunks)) if cfg.paired_baseline else per_sample.mean())
        with torch.no_grad():
            stats = {"nft_loss": loss.detach(), "drift": ((v_theta - v_old).abs() * mask).sum().double() / mask.sum().double()}
        if self.anchor is not None:
            with torch.no_grad():
                anchor_emb = self.anchor.encode(obs).repeat(len(x_t) // len(chunks), 1)
                v_init = self.anchor.training_velocity(x_t, t, anchor_emb, r_start)
            drift = ((v_theta - v_init).square() * mask).sum(-1).mean() / mask[0].sum()
            loss = loss + cfg.anchor_coef * drift
            stats["anchor_drift"] = drift.detach()
        return loss, stats

    def update(self, generator: torch.Generator | None = None) -> dict[str, float]:
        cfg, storage, policy = self.cfg, self.storage, self.policy
        critic = cfg.optimality == "gae"
        if critic:  # group advantages were normalised within their groups by the runner
            storage.advantages = normalized_advantages(storage.advantages, self.sync)
        warmup = critic and self.iterations < cfg.critic_warmup_iterations
        logged: list[dict[str, torch.Tensor]] = []  # per minibatch; read once at the end (no host round trip each)
        for mb in storage.minibatches(cfg.num_minibatches, cfg.num_epochs, generator):
            r = optimality(mb["advantages"], cfg.adv_clip)
            stats = {"r_mean": r.mean(), "r_decisive": ((r - 0.5).abs() > 0.25).float().mean()}
            loss = torch.zeros((), device=self.device)
            if critic:
                value_loss = clipped_value_loss(policy.value(mb["obs"]), mb["values"], mb["returns"], cfg.value_clip)
                loss = loss + value_loss
                stats["value_loss"] = value_loss.detach()
            if not warmup:
                nft, nft_stats = self.loss(mb["obs"], mb["chunks"], r, generator)
                loss = loss + nft
                stats.update(nft_stats)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if self.sync:
                self.sync.gradients(policy.parameters())
            for params in (self.policy_params, self.value_params):
                nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            self.optimizer.step()
            logged.append(stats)
        self.iterations += 1
        self.refresh_reference()
        names = list(logged[0])
        columns = torch.stack([torch.stack([row[k] for k in names]) for row in logged]).T.tolist()
        # the same float sums as adding each minibatch's .item() in turn
        out = {k: sum(column, 0.0) / len(logged) for k, column in zip(names, columns, strict=True)}
        out.update(critic_warmup=float(warmup), ref_ema=self.ref_ema(), lr=cfg.lr)
        return out

    @torch.no_grad()
    def refresh_reference(self) -> None:
        """theta_old <- eta theta_old + (1 - eta) theta (eta = 0: the reference is the current policy)."""
        eta = self.ref_ema()
        for ref, cur in zip(self.reference.parameters(), self.policy.parameters(), strict=True):
            ref.lerp_(cur, 1.0 - eta)
        for ref, cur in zip(self.reference.buffers(), self.policy.buffers(), strict=True):
            ref.copy_(cur)


register_algorithm(AlgorithmSpec(
    name="flow-nft", summary="forward-process flow-policy RL (DiffusionNFT): no likelihoods, any solver (fine-tunes --init)",
    config_field="flow_nft", config=FlowNFTConfig, policy_kind="flow",
    runner="rlrobot.runners.flow_on_policy:FlowNFTRunner", run_fields=(InitCheckpoint, PolicyTrimInput)))
