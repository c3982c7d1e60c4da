"""The FlowPolicy adapter around a LeRobot flow VLA (pi0, pi0.5, SmolVLA): what is shared by the three.

* ``encode(obs)``: our observations -> LeRobot's inputs (state normalised with the dataset's mean / std, images to
  [0, 1] floats, the instruction tokenised in-process) -> the VLM prefix, run once with ``use_cache`` -> a
  ``VLAEncoding`` holding the KV cache (and the prefix output, for the pi0.5 / SmolVLA value head).
* ``velocity(x_t, t, enc)``: one call of LeRobot's own ``denoise_step`` (the action expert on the cached prefix) on our
  flattened chunk, zero-padded to the model's ``max_action_dim``; the expert's per-token features (the input of
  ``action_out_proj``) come back through a forward hook and feed the Flow-Noise head and the pi0 value head.
* ``FlowSampling`` supplies the denoising loop and the exact per-step log-probs (not LeRobot's no-grad
  ``sample_actions``). Time convention as openpi / LeRobot: t = 1 is noise, x_t = t eps + (1 - t) a, v = eps - a.

The padded action dims (``max_action_dim`` beyond the task's) stay at 0, the mode of their noise, over the whole chain:
their clean target is 0 in LeRobot's training, so they carry no information and no log-prob.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from rlrobot.policies.actor_critic import mlp
from rlrobot.policies.flow import FlowSampling, time_grid

from .config import VLAConfig


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
        self.tokenizer = tokenizer
        if state_dim is not None:
            self.register_buffer("state_mean", torch.zeros(state_dim))
            self.register_buffer("state_std", torch.ones(state_dim))
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
        self._features: list[torch.Tensor] = []
        self.model.action_out_proj.register_forward_hook(lambda _m, inp, _out: self._features.append(inp[0]))
        self._init_language()

    @property
    def model(self) -> nn.Module:
        """LeRobot's core model (PI0Pytorch / PI05Pytorch / VLAFlowMatching)."""
        return self.lerobot.model

    # ------------------------------------------------------------------ variant hooks
    def _init_language(self) -> None:
        """Tokens of a fixed instruction, as buffers made here (not under a rollout's inference mode)."""

    def _fixed_instruction(self, text: str, max_length: int, padding: str = "max_length") -> None:
        tokens, masks = self.tokens([text], max_length, torch.device("cpu"), padding)
        self.register_buffer("lang_tokens", tokens, persistent=False)
        self.register_buffer("lang_masks", masks, persistent=False)

    def _instruction_tokens(self, bsize: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.lang_tokens.expand(bsize, -1), self.lang_masks.expand(bsize, -1)

    def _prefix_width(self) -> int:
        raise NotImplementedError

    def _prefix(self, batch: dict[str, torch.Tensor], bsize: int) -> tuple[torch.Tensor, Any, torch.Tensor, dict]:
        """(prefix output [B, L, W], KV cache, prefix pad mask [B, L], extra expert inputs)"""
        raise NotImplementedError

    def _denoise(self, enc: VLAEncoding, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    # ------------------------------------------------------------------ observation mapping
    def lerobot_batch(self, obs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Our observation dict -> LeRobot feature names (``observation.state`` normalised, ``observation.images.*`` in
        [0, 1]); the instruction is added by the variant (tokens, or pi0.5's prompt with the discretised state)."""
        batch: dict[str, torch.Tensor] = {}
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
        """LeRobot's denoise_step on our flat chunk: (velocity [B, H*A], expert features [B, H*W])."""
        bsize = x_t.shape[0]
        x = x_t.reshape(bsize, self.chunk_size, self.action_dim)
        x = nn.functional.pad(x, (0, self.max_action_dim - self.action_dim))
        self._features.clear()
        with self._autocast(x_t.device):
            v = self._denoise(emb, x, t.float())
        features = self._features.pop().float()
        self._features.clear()
        return v[:, :, :self.action_dim].float().reshape(bsize, -1), features.reshape(bsize, -1)

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
