"""The FlowPolicy adapter around a LeRobot flow VLA (pi0, pi0.5, SmolVLA): what is shared by the three.

* ``encode(obs)``: our observations -> LeRobot's inputs (state normalised with the dataset's mean / std, images to
  [0, 1] floats, the instruction tokenised in-process) -> the VLM prefix, run once with ``use_cache`` -> a
  ``VLAEncoding`` holding the KV cache (and the prefix output, for the pi0.5 / SmolVLA value head).
* ``velocity(x_t, t, enc)``: one call of LeRobot's own ``denoise_step`` (the action expert on the cached prefix) on our
  flattened chunk, zero-padded to the model's ``max_action_dim``; the expert's per-token features (the input of
  ``action_out_proj``) come back through a forward hook and feed the Flow-Noise head and the pi0 value head.
* ``FlowSampling`` supplies the denoising loop and the exact per-step log-probs (not LeRobot's no-grad
  ``sample_actions``). Time convention as openpi / LeRobot: t = 1 is noise, x_t = t eps + (1 - t) a, v = eps - a.

The padded action dims (``max_action_dim`` beyond the task's) are integrated as LeRobot's ``sample_actions`` integrates
them: they start at the noise's mode 0 (or at given noise) and follow the ODE with the expert's own velocity, so our
deterministic chunk equals LeRobot's ``predict_action_chunk`` for the same noise. The public chain holds the task's
dims only; the padded ones are a deterministic function of the observation and that chain (no noise, no log-prob),
recomputed from it by ``chain_log_prob``. The flow-matching loss noises them as LeRobot's training does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from rlrobot.envs.language import TOKENS_KEY
from rlrobot.policies.actor_critic import mlp
from rlrobot.policies.flow import SAMPLE_MODES, FlowSampling, gaussian_log_prob, time_grid

from .config import VLAConfig
from .processors import Affine


class VLAEncoding:
    """What ``encode`` returns: the VLM prefix's KV cache per layer, its padding mask and the mean of its output over
    valid tokens, plus variant inputs the expert needs (pi0's state). Behaves like a batch of embeddings for
    ``FlowSampling`` (``len``, ``shape[0]``, ``device``, ``repeat_interleave``)."""

    def __init__(self, kv: list[tuple[torch.Tensor, torch.Tensor, Any]], pad_masks: torch.Tensor,
                 prefix_mean: torch.Tensor, extra: dict[str, torch.Tensor] | None = None):
        self.kv, self.pad_masks, self.prefix_mean = kv, pad_masks, prefix_mean
        self.extra = extra or {}

    def __len__(self) -> int:
        return self.pad_masks.shape[0]

    @property
    def shape(self) -> torch.Size:
        return torch.Size([len(self)])

    @property
    def device(self) -> torch.device:
        return self.pad_masks.device

    def repeat_interleave(self, repeats: int, dim: int = 0) -> VLAEncoding:
        if dim != 0:
            raise ValueError("a VLAEncoding repeats along the batch only")
        if repeats == 1:
            return self
        rep = lambda x: x.repeat_interleave(repeats, dim=0)  # noqa: E731
        return VLAEncoding([(rep(k), rep(v), sw) for k, v, sw in self.kv], rep(self.pad_masks), rep(self.prefix_mean),
                           {n: rep(x) for n, x in self.extra.items()})

    def cache(self):
        """A fresh DynamicCache over the stored prefix K/V (the expert appends its own K/V to it; ours stay intact)."""
        from transformers import DynamicCache

        return DynamicCache(tuple(self.kv))


def _cache_layers(cache) -> list[tuple[torch.Tensor, torch.Tensor, Any]]:
    return [(k, v, sw) for k, v, sw in cache]


class VLAPolicy(nn.Module, FlowSampling):
    """FlowPolicy over a LeRobot flow VLA. Subclasses fill ``_prefix`` (prefix embedding + VLM forward with cache) and
    ``_denoise`` (LeRobot's ``denoise_step`` with the variant's arguments)."""

    value_on_expert = False
    """pi0: the value head reads the action expert's features (pi_RL); pi0.5 / SmolVLA: the VLM's prefix output"""

    def __init__(self, lerobot_policy: nn.Module, cfg: VLAConfig, obs_keys: tuple[str, ...], state_dim: int | None,
                 action_dim: int, tokenizer: Any):
        super().__init__()
        self.lerobot = lerobot_policy  # its weights are ours: state_dict names "lerobot.model.*"
        self.vla_cfg = cfg
        self.obs_keys = obs_keys
        self.action_dim = action_dim
        self.chunk_size = cfg.chunk_size
        self.denoising_steps = cfg.denoising_steps
        self.execute_steps = cfg.execute_steps or cfg.chunk_size
        self.flat_dim = self.chunk_size * action_dim
        self.max_action_dim = int(lerobot_policy.config.max_action_dim)
        self.padded_dim = self.max_action_dim - action_dim
        self._padded: torch.Tensor | None = None  # the padded dims' state [B, H, P] while a chain is integrated
        self._padded_velocity: torch.Tensor | None = None
        self.tokenizer = tokenizer
        if state_dim is not None:  # LeRobot's state normalisation as (x - state_mean) / state_std, any mode
            self.register_buffer("state_mean", torch.zeros(state_dim))
            self.register_buffer("state_std", torch.ones(state_dim))
        # the checkpoint's action un-normalisation (chunk * action_scale + action_shift), read from its processor files
        # at every build, so not saved with our weights; identity without statistics
        self.register_buffer("action_shift", torch.zeros(action_dim), persistent=False)
        self.register_buffer("action_scale", torch.ones(action_dim), persistent=False)
        width = self.model.action_out_proj.in_features
        self.expert_width = width
        self.noise_head = mlp(width, cfg.noise_hidden, action_dim, "tanh")
        value_in = width if self.value_on_expert else self._prefix_width()
        self.value_head = mlp(value_in, cfg.value_hidden, 1, "tanh")
        nn.init.normal_(self.value_head[-1].weight, std=0.02)  # pi_RL: the critic's last layer starts small
        nn.init.zeros_(self.value_head[-1].bias)
        self.log_var_min = 2 * math.log(cfg.noise_std_min)
        self.log_var_max = 2 * math.log(cfg.noise_std_max)
        self.instruction = cfg.instruction
        # no fixed instruction and the task observes each env's: every row is prompted with its own (the suite)
        self.per_env_instruction = not cfg.instruction and TOKENS_KEY in obs_keys
        self._text_cache: dict[tuple[int, ...], str] = {}  # instruction token ids -> text
        self._token_cache: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # text -> the VLA's tokens and mask
        self._features: list[torch.Tensor] = []
        # a bound method, not a closure: a deep copy (an overlapped run's actor, NFT's reference) records into its own list
        self.model.action_out_proj.register_forward_hook(self._record_features)
        self._init_language()

    def _record_features(self, _module: nn.Module, inputs: tuple[torch.Tensor, ...], _output: torch.Tensor) -> None:
        self._features.append(inputs[0])

    @property
    def model(self) -> nn.Module:
        """LeRobot's core model (PI0Pytorch / PI05Pytorch / VLAFlowMatching)."""
        return self.lerobot.model

    # ------------------------------------------------------------------ variant hooks
    def _init_language(self) -> None:
        """Tokens of a fixed instruction, as buffers made here (not under a rollout's inference mode)."""

    def _fixed_instruction(self, text: str, max_length: int, padding: str = "max_length", suffix: str = "") -> None:
        self._language = (suffix, max_length, padding)  # how each env's own instruction is tokenised (per_env)
        tokens, masks = self.tokens([text + suffix], max_length, torch.device("cpu"), padding)
        self.register_buffer("lang_tokens", tokens, persistent=False)
        self.register_buffer("lang_masks", masks, persistent=False)

    def _instruction_tokens(self, batch: dict[str, Any], bsize: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The fixed instruction's tokens for every row, or (per-env instructions: ``batch["task"]``) each row's own
        text tokenised as LeRobot's TokenizerProcessorStep tokenises a batch of tasks: every distinct text once (cached,
        to ``max_length``; right padding, so a "longest" batch is the same rows cut to its longest text)."""
        if "task" not in batch:
            return self.lang_tokens.expand(bsize, -1), self.lang_masks.expand(bsize, -1)
        suffix, max_length, padding = self._language
        texts = batch["task"]
        unique = sorted(set(texts))
        missing = [t for t in unique if t not in self._token_cache]
        if missing:
            tokens, masks = self.tokens([t + suffix for t in missing], max_length, torch.device("cpu"), "max_length")
            self._token_cache.update({t: (tokens[i], masks[i]) for i, t in enumerate(missing)})
        device = self.lang_tokens.device
        row = {t: i for i, t in enumerate(unique)}
        index = torch.tensor([row[t] for t in texts], device=device)
        tokens = torch.stack([self._token_cache[t][0] for t in unique]).to(device)[index]
        masks = torch.stack([self._token_cache[t][1] for t in unique]).to(device)[index]
        if padding != "max_length":
            length = int(masks.sum(1).max())
            tokens, masks = tokens[:, :length], masks[:, :length]
        return tokens, masks

    def instruction_texts(self, obs: dict[str, torch.Tensor]) -> list[str] | None:
        """Each row's instruction from its ``instruction_tokens`` observation (the suite's vocabulary; every distinct
        row decoded once, then cached), or None for a policy with one fixed instruction."""
        if not self.per_env_instruction:
            return None
        from rlrobot.tasks.so101_suite import VOCABULARY  # the vocabulary of the instruction_tokens observation

        ids = obs[TOKENS_KEY]
        unique, inverse = torch.unique(ids.detach().to("cpu", torch.long), dim=0, return_inverse=True)
        texts = []
        for row in unique:
            key = tuple(row.tolist())
            if key not in self._text_cache:
                self._text_cache[key] = VOCABULARY.decode(row.numpy())
            texts.append(self._text_cache[key])
        return [texts[i] for i in inverse.tolist()]

    def _prefix_width(self) -> int:
        raise NotImplementedError

    def _prefix(self, batch: dict[str, torch.Tensor], bsize: int) -> tuple[torch.Tensor, Any, torch.Tensor, dict]:
        """(prefix output [B, L, W], KV cache, prefix pad mask [B, L], extra expert inputs)"""
        raise NotImplementedError

    def _denoise(self, enc: VLAEncoding, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    # ------------------------------------------------------------------ observation mapping
    def lerobot_batch(self, obs: dict[str, torch.Tensor]) -> dict[str, Any]:
        """Our observation dict -> LeRobot feature names (``observation.state`` normalised, ``observation.images.*`` in
        [0, 1]), ``task`` each row's instruction text where the envs have their own; the instruction is added by the
        variant (tokens, or pi0.5's prompt with the discretised state)."""
        batch: dict[str, Any] = {}
        texts = self.instruction_texts(obs)
        if texts is not None:
            batch["task"] = texts
        for key in self.obs_keys:
            x = obs[key]
            if key == "state":
                batch["observation.state"] = ((x.float() - self.state_mean) / self.state_std).clamp(-10.0, 10.0)
            elif key.startswith("image_"):
                batch["observation.images." + key.removeprefix("image_")] = x.float() / 255.0
        return batch

    def tokens(self, texts: list[str], max_length: int, device: torch.device, padding: str = "max_length"
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """LeRobot's TokenizerProcessorStep: right padding to ``max_length`` (or the longest text), truncation."""
        self.tokenizer.padding_side = "right"
        out = self.tokenizer(texts, max_length=max_length, padding=padding, truncation=True, return_tensors="pt")
        return out["input_ids"].to(device), out["attention_mask"].to(device).bool()

    def _autocast(self, device: torch.device):
        enabled = device.type == "cuda" and self.vla_cfg.bf16
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled)

    # ------------------------------------------------------------------ the FlowPolicy protocol
    def encode(self, obs: dict[str, torch.Tensor]) -> VLAEncoding:
        bsize = next(iter(obs.values())).shape[0]
        device = self.state_mean.device if hasattr(self, "state_mean") else next(self.parameters()).device
        with self._autocast(device):
            prefix_out, cache, pad_masks, extra = self._prefix(self.lerobot_batch(obs), bsize)
        valid = pad_masks[:, :, None].to(prefix_out.dtype)
        prefix_mean = ((prefix_out * valid).sum(1) / valid.sum(1).clamp_min(1.0)).float()
        return VLAEncoding(_cache_layers(cache), pad_masks, prefix_mean, extra)

    def velocity(self, x_t: torch.Tensor, t: torch.Tensor, emb: VLAEncoding) -> tuple[torch.Tensor, torch.Tensor]:
        """LeRobot's denoise_step on our flat chunk: (velocity [B, H*A], expert features [B, H*W]). The padded dims
        are the chain's current padded state inside ``sample_chain`` / ``chain_log_prob`` (their velocity is kept for
        the next step), 0 elsewhere (flow-matching targets, the pi0 critic)."""
        bsize = x_t.shape[0]
        x = x_t.reshape(bsize, self.chunk_size, self.action_dim)
        padded = self._padded if self._padded is not None else x.new_zeros(bsize, self.chunk_size, self.padded_dim)
        x = torch.cat([x, padded.to(x.dtype)], dim=-1)
        self._features.clear()
        with self._autocast(x_t.device):
            v = self._denoise(emb, x, t.float())
        features = self._features.pop().float()
        self._features.clear()
        self._padded_velocity = v[:, :, self.action_dim:].float()
        return v[:, :, :self.action_dim].float().reshape(bsize, -1), features.reshape(bsize, -1)

    @contextmanager
    def _padded_state(self, padded: torch.Tensor) -> Iterator[None]:
        self._padded = padded
        try:
            yield
        finally:
            self._padded, self._padded_velocity = None, None

    def _padded_start(self, batch: int, device: torch.device, padded_init: torch.Tensor | None) -> torch.Tensor:
        if padded_init is None:
            return torch.zeros(batch, self.chunk_size, self.padded_dim, device=device)
        if tuple(padded_init.shape) != (batch, self.chunk_size, self.padded_dim):
            raise ValueError(f"padded_init has shape {list(padded_init.shape)}; expected "
                             f"[{batch}, {self.chunk_size}, {self.padded_dim}] (batch, chunk, max_action_dim - action_dim)")
        return padded_init.to(device=device, dtype=torch.float32)

    def sample_chain(self, obs: dict[str, torch.Tensor], mode: str = "ode", noise_level: float = 0.5,
                     stochastic_steps: torch.Tensor | None = None, generator: torch.Generator | None = None,
                     emb: VLAEncoding | None = None, x_init: torch.Tensor | None = None,
                     padded_init: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``FlowSampling.sample_chain`` (same chain [B, K + 1, H*A] and log-probs [B, K, H*A]) with the padded dims
        integrated alongside by the ODE step, from ``padded_init`` [B, H, P] (default 0, the noise's mode)."""
        if mode not in SAMPLE_MODES:
            raise ValueError(f"mode={mode!r} is not one of {SAMPLE_MODES}")
        emb = self.encode(obs) if emb is None else emb
        batch = emb.shape[0]
        x = torch.randn(batch, self.flat_dim, device=emb.device, generator=generator) if x_init is None else x_init
        grid = time_grid(self.denoising_steps, emb.device)
        chain, log_probs = [x], []
        with self._padded_state(self._padded_start(batch, emb.device, padded_init)):
            for k in range(self.denoising_steps):
                ks = torch.full((batch,), k, device=emb.device, dtype=torch.long)
                mean, std, ode_mean = self.step_distribution(x, ks, emb, mode, noise_level)
                self._padded = self._padded - (grid[k] - grid[k + 1]) * self._padded_velocity
                if mode == "ode":
                    x = mean
                    log_probs.append(torch.zeros_like(mean))
                else:
                    active = torch.ones(batch, 1, dtype=torch.bool, device=emb.device) if stochastic_steps is None \
                        else stochastic_steps[:, k:k + 1]
                    drawn = mean + std * torch.randn(mean.shape, device=emb.device, generator=generator)
                    x = torch.where(active, drawn, ode_mean)
                    log_probs.append(torch.where(active, gaussian_log_prob(x, mean, std.clamp_min(1e-12)),
                                                 torch.zeros_like(mean)))
                chain.append(x)
        return torch.stack(chain, dim=1), torch.stack(log_probs, dim=1)

    def chain_log_prob(self, obs: dict[str, torch.Tensor], chain: torch.Tensor, steps: torch.Tensor, mode: str,
                       noise_level: float = 0.5, emb: VLAEncoding | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``FlowSampling.chain_log_prob`` for a chain whose padded dims started at 0: their states along the stored
        chain are recomputed first (no gradient: like a stored input, as a chain that kept them would give them), then
        all S stored steps are evaluated in one batched pass with gradients."""
        emb = self.encode(obs) if emb is None else emb
        batch, num = steps.shape
        grid = time_grid(self.denoising_steps, chain.device)
        padded = [torch.zeros(batch, self.chunk_size, self.padded_dim, device=chain.device)]
        with torch.no_grad(), self._padded_state(padded[0]):
            for k in range(int(steps.max()) if steps.numel() else 0):
                ks = torch.full((batch,), k, device=chain.device, dtype=torch.long)
                self.step_distribution(chain[:, k], ks, emb, mode, noise_level)
                self._padded = self._padded - (grid[k] - grid[k + 1]) * self._padded_velocity
                padded.append(self._padded)
        padded_in = torch.stack(padded, dim=1)[torch.arange(batch, device=chain.device)[:, None], steps]
        x_in = chain.gather(1, steps[:, :, None].expand(-1, -1, chain.shape[-1]))
        x_out = chain.gather(1, (steps + 1)[:, :, None].expand(-1, -1, chain.shape[-1]))
        with self._padded_state(padded_in.reshape(batch * num, self.chunk_size, self.padded_dim)):
            mean, std, _ = self.step_distribution(x_in.reshape(batch * num, -1), steps.reshape(-1),
                                                  emb.repeat_interleave(num, dim=0), mode, noise_level)
        mean, std = mean.reshape(batch, num, -1), std.reshape(batch, num, -1)
        return gaussian_log_prob(x_out, mean, std), std, emb

    def noise_std(self, features: torch.Tensor) -> torch.Tensor:
        f = features.reshape(len(features), self.chunk_size, self.expert_width)
        u = torch.tanh(self.noise_head(f))
        log_var = self.log_var_min + (u + 1.0) * 0.5 * (self.log_var_max - self.log_var_min)
        return torch.exp(0.5 * log_var).reshape(len(features), -1)

    def value_from_embedding(self, emb: VLAEncoding) -> torch.Tensor:
        if self.value_on_expert:
            # pi_RL's pi0 critic: the expert output, mean over action tokens, averaged over the K denoising times; here
            # on the noise mode x = 0 at each grid time (deterministic, so rollout and update see the same value)
            k = self.denoising_steps
            rep = emb.repeat_interleave(k)
            t = time_grid(k, emb.device)[:k].repeat(len(emb))
            _, feats = self.velocity(torch.zeros(len(rep), self.flat_dim, device=emb.device), t, rep)
            x = feats.reshape(len(emb), k, self.chunk_size, self.expert_width).mean((1, 2))
        else:
            x = emb.prefix_mean
        if self.vla_cfg.detach_critic:
            x = x.detach()
        return self.value_head(x).squeeze(-1)

    def value(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.value_from_embedding(self.encode(obs))

    def value_parameters(self) -> Iterable[nn.Parameter]:
        return self.value_head.parameters()

    def flow_matching_parameters(self) -> Iterable[nn.Parameter]:
        heads = {id(p) for head in (self.value_head, self.noise_head) for p in head.parameters()}
        return [p for p in self.parameters() if id(p) not in heads and p.requires_grad]

    def set_normalisation(self, norm: dict[str, Affine]) -> None:
        """A LeRobot checkpoint's statistics (``processors.read_normalisation``): the state's normalisation and the
        action's un-normalisation, as LeRobot's pre- / post-processor apply them."""
        for feature, (shift, scale) in (("observation.state", ("state_mean", "state_std")),
                                        ("action", ("action_shift", "action_scale"))):
            if feature not in norm or not hasattr(self, shift):
                continue
            buffer = getattr(self, shift)
            if norm[feature].shift.shape != buffer.shape:
                raise ValueError(f"the checkpoint's {feature} statistics have shape {list(norm[feature].shift.shape)}; "
                                 f"the policy's {feature} has {list(buffer.shape)}")
            buffer.copy_(norm[feature].shift)
            getattr(self, scale).copy_(norm[feature].scale)

    def flow_matching_loss(self, obs: dict[str, torch.Tensor], actions: torch.Tensor, t: torch.Tensor,
                           noise: torch.Tensor, mask: torch.Tensor | None = None,
                           generator: torch.Generator | None = None, padded_noise: torch.Tensor | None = None
                           ) -> torch.Tensor:
        """``FlowSampling.flow_matching_loss`` as LeRobot's ``forward`` computes it: actions normalised with the
        checkpoint's statistics, the padded dims of x_t at t * their own noise (``padded_noise`` [B, H, P], drawn from
        ``generator`` if not given; their clean value is 0), the loss over the task's dims."""
        actions = (actions - self.action_shift) / self.action_scale
        if padded_noise is None:
            padded_noise = torch.randn(len(actions), self.chunk_size, self.padded_dim, device=actions.device,
                                       generator=generator)
        with self._padded_state(t[:, None, None].float() * padded_noise.to(actions.device)):
            return super().flow_matching_loss(obs, actions, t, noise, mask, generator)

    def actions_to_chain(self, actions: torch.Tensor) -> torch.Tensor:
        return (actions - self.action_shift) / self.action_scale

    @contextmanager
    def hidden_chain_state(self, batch: int, device: torch.device) -> Iterator[Callable[[float], None]]:
        """The padded dims from 0 for a sampler's own loop (RTC); ``advance(delta)`` takes their ODE step with the
        velocity of the step's velocity call (detached: such samplers differentiate x only)."""
        def advance(delta: float) -> None:
            self._padded = (self._padded - delta * self._padded_velocity).detach()

        with self._padded_state(self._padded_start(batch, device, None)):
            yield advance

    def chain_actions(self, x: torch.Tensor) -> torch.Tensor:
        """The chain's final state un-normalised with the checkpoint's statistics (LeRobot's postprocessor): chunks
        [B, H, A] in the checkpoint's action units (for evaluation, serving and RL rollouts alike)."""
        return x.reshape(-1, self.chunk_size, self.action_dim) * self.action_scale + self.action_shift

    def fit_observation_stats(self, obs: dict[str, torch.Tensor]) -> None:
        """Our dataset's state mean / std become the VLA's input normalisation (LeRobot's MEAN_STD)."""
        if "state" in obs and hasattr(self, "state_mean"):
            state = obs["state"].float()
            self.state_mean.copy_(state.mean(0).to(self.state_mean.device))
            self.state_std.copy_(state.std(0).clamp_min(1e-3).to(self.state_std.device))

    def state_dict(self, *args, **kwargs):
        # safetensors refuses tensors that share memory (PaliGemma ties its LM head to the embeddings): keep one name
        sd = super().state_dict(*args, **kwargs)
        seen: dict[tuple[int, int, tuple[int, ...]], str] = {}
        for name in list(sd):
            t = sd[name]
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
            if key in seen:
                del sd[name]
            else:
                seen[key] = name
        return sd

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        missing = set(super().state_dict()) - set(state_dict)
        own = super().state_dict()
        # the names dropped as ties in state_dict() are restored from their twin (same storage)
        tied = {n for n in missing if any(own[n].untyped_storage().data_ptr() == own[m].untyped_storage().data_ptr()
                                          for m in state_dict if m in own)}
        result = super().load_state_dict(state_dict, strict=False, assign=assign)
        if strict:
            bad_missing = [k for k in result.missing_keys if k not in tied]
            if bad_missing or result.unexpected_keys:
                raise RuntimeError(f"VLA weights do not match: missing {bad_missing[:5]}, unexpected "
                                   f"{result.unexpected_keys[:5]}")
        return result
