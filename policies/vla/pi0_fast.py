"""LeRobot's pi0-FAST (``lerobot.policies.pi0_fast``: ``PI0FastPolicy``, config type ``pi0_fast``) as an autoregressive
token policy for token-level RL (VLA-RL): per-token log-probs, a value head on the VLM, batch decoding over envs.

* Offline build (``build_tiny_pi0_fast``): LeRobot's own classes with a shrunken PaliGemma (as ``tiny.py`` does for
  pi0), a FAST tokenizer fitted on our action chunks (``fast_tokenizer.py``) and a small text tokenizer. LeRobot's
  ``PI0FastPolicy.__init__`` loads both tokenizers from the hub (``lerobot/fast-action-tokenizer``,
  ``google/paligemma-3b-pt-224``); the build / load context hands it the local ones instead.
* Vocabulary of the VLM: [text tokens | 256 state-bin tokens | FAST action tokens]; LeRobot instead writes the state as
  text digits and maps action tokens to the end of PaliGemma's 257k vocabulary (``fast_skip_tokens``). Our sequence:
  [image tokens, "Task: <prompt>, State:", state bins, <bos>] then the action tokens, ended by <eos>. Image tokens: the
  task's camera if the policy has one, else LeRobot's empty-camera convention (a constant image).
* ``TokenVLAPolicy.sample``: batched autoregressive decoding for all envs at once (one full forward per token, no KV
  cache: exact and simple; the tiny model is cheap), restricted to action tokens and <eos>; returns tokens, per-token
  log-probs and the mask of real tokens (up to and including <eos>). ``token_log_probs`` re-evaluates a stored
  sequence in one teacher-forced pass (the PPO ratio). ``actions`` decodes tokens to chunks through the FAST tokenizer
  (a per-env Python loop: BPE decoding is a string operation).
* Value head: the mean of the VLM's output over the image + prompt tokens (detachable), an MLP, last layer N(0, 0.02)
  as pi_RL / VLA-RL put the critic on the VLM.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .fast_tokenizer import FASTActionTokenizer
from .load import require_lerobot
from .tiny import DEFAULT_SIZES, make_tokenizer

STATE_BINS = 256
MARKER = "rlrobot_pi0_fast.json"


@contextmanager
def _pi0_fast_patches(sizes: dict[str, Any], text_tokenizer) -> Iterator[Any]:
    """pi0-FAST's module builds the shrunken PaliGemma and gets the local tokenizers while inside."""
    require_lerobot()
    mod = importlib.import_module("lerobot.policies.pi0_fast.modeling_pi0_fast")
    small = mod.GemmaConfig(width=sizes["width"], depth=sizes["depth"], mlp_dim=sizes["mlp"], num_heads=8,
                            num_kv_heads=1, head_dim=sizes["head_dim"])
    orig = (mod.get_gemma_config, mod.PaliGemmaForConditionalGenerationWithPiGemma, mod.AutoProcessor, mod.AutoTokenizer)

    def paligemma(config):
        vision = config.vision_config
        vision.hidden_size, vision.intermediate_size = sizes["vision_hidden"], sizes["vision_mlp"]
        vision.num_hidden_layers, vision.num_attention_heads = 1, 2
        vision.patch_size, vision.image_size = sizes["patch"], sizes["image"]
        vision.projection_dim = sizes["width"]
        config.text_config.vocab_size = sizes["vocab"]
        config._vocab_size = sizes["vocab"]
        config.image_token_index = sizes["vocab"] - 1
        return orig[1](config=config)

    class _Local:  # AutoProcessor / AutoTokenizer stand-ins: the action tokenizer is ours (the adapter uses it)
        def __init__(self, obj):
            self.obj = obj

        def from_pretrained(self, *args, **kwargs):
            return self.obj

    mod.get_gemma_config = lambda variant_name: small
    mod.PaliGemmaForConditionalGenerationWithPiGemma = paligemma
    mod.AutoProcessor, mod.AutoTokenizer = _Local(None), _Local(text_tokenizer)
    try:
        yield mod
    finally:
        (mod.get_gemma_config, mod.PaliGemmaForConditionalGenerationWithPiGemma, mod.AutoProcessor,
         mod.AutoTokenizer) = orig


def build_tiny_pi0_fast(out_dir: str | os.PathLike, state_dim: int, action_chunks: np.ndarray, prompt: str,
                        max_action_tokens: int = 24, fast_vocab: int = 128, scale: float = 10.0, seed: int = 0,
                        sizes: dict[str, Any] | None = None) -> Path:
    """A tiny random LeRobot pi0-FAST for our spaces (LeRobot's save_pretrained) + a FAST tokenizer fitted on
    ``action_chunks`` [N, H, A] + a text tokenizer, in ``out_dir``. Offline and deterministic under ``seed``."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    require_lerobot()
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.pi0_fast.configuration_pi0_fast import PI0FastConfig

    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    chunks = np.asarray(action_chunks, np.float64)
    fast = FASTActionTokenizer.fit(chunks, scale=scale, vocab_size=fast_vocab)
    text = make_tokenizer([f"Task: {prompt}, State:"])
    sizes = {**DEFAULT_SIZES, **(sizes or {})}
    sizes["vocab"] = len(text) + STATE_BINS + fast.vocab_size + 1  # + the image token index (the last id)
    horizon, action_dim = chunks.shape[1:]
    cfg = PI0FastConfig(input_features={"observation.state": PolicyFeature(type=FeatureType.STATE, shape=(state_dim,))},
                        output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(action_dim,))},
                        chunk_size=horizon, n_action_steps=horizon, max_action_tokens=max_action_tokens,
                        max_decoding_steps=max_action_tokens, empty_cameras=1, device="cpu", dtype="float32",
                        image_resolution=(sizes["image"], sizes["image"]), max_state_dim=max(32, state_dim),
                        max_action_dim=max(32, action_dim), text_tokenizer_name=str(out / "tokenizer"),
                        action_tokenizer_name=str(out / "fast_tokenizer"))
    torch.manual_seed(seed)
    with _pi0_fast_patches(sizes, text) as mod:
        policy = mod.PI0FastPolicy(cfg)
    policy.save_pretrained(out)
    text.save_pretrained(out / "tokenizer")
    fast.save(out / "fast_tokenizer")
    (out / MARKER).write_text(json.dumps({"sizes": sizes, "prompt": prompt, "state_dim": state_dim}, indent=1))
    return out


def load_pi0_fast(path: str | os.PathLike, **kwargs: Any) -> TokenVLAPolicy:
    """A ``TokenVLAPolicy`` over the pi0-FAST directory ``path`` (local disk only) written by ``build_tiny_pi0_fast``."""
    path = Path(path)
    if not (path / MARKER).is_file() or not (path / "config.json").is_file():
        raise ValueError(f"{path} is not a pi0-FAST directory of rlrobot (config.json, {MARKER}, tokenizer/, "
                         f"fast_tokenizer/)")
    if json.loads((path / "config.json").read_text()).get("type") != "pi0_fast":
        raise ValueError(f"{path}/config.json is not a LeRobot pi0_fast policy")
    from transformers import AutoTokenizer

    meta = json.loads((path / MARKER).read_text())
    text = AutoTokenizer.from_pretrained(str(path / "tokenizer"), local_files_only=True)
    with _pi0_fast_patches(meta["sizes"], text) as mod:
        lerobot_policy = mod.PI0FastPolicy.from_pretrained(str(path), local_files_only=True)
    policy = TokenVLAPolicy(lerobot_policy, text, FASTActionTokenizer.load(path / "fast_tokenizer"), meta["state_dim"],
                            meta["prompt"], **kwargs)
    if "state_mean" in meta:  # written by save_pi0_fast (e.g. after token SFT)
        policy.state_mean.copy_(torch.tensor(meta["state_mean"]))
        policy.state_std.copy_(torch.tensor(meta["state_std"]))
    return policy


def save_pi0_fast(policy: TokenVLAPolicy, source: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Write ``policy`` (e.g. after token SFT) as a pi0-FAST directory like ``source``'s: LeRobot's save_pretrained,
    the same tokenizers, and the state normalisation in the marker (the value head is not part of it)."""
    import shutil

    source, out = Path(source), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    policy.lerobot.save_pretrained(out)
    for sub in ("tokenizer", "fast_tokenizer"):
        shutil.copytree(source / sub, out / sub, dirs_exist_ok=True)
    meta = json.loads((source / MARKER).read_text())
    meta.update(state_mean=policy.state_mean.tolist(), state_std=policy.state_std.tolist())
    (out / MARKER).write_text(json.dumps(meta, indent=1))
    return out


class TokenVLAPolicy(nn.Module):
    def __init__(self, lerobot_policy: nn.Module, text_tokenizer, fast: FASTActionTokenizer, state_dim: int, prompt: str,
                 value_hidden: int = 64, detach_value: bool = True, max_tokens: int | None = None):
        super().__init__()
        self.lerobot = lerobot_policy
        cfg = lerobot_policy.config
        self.fast, self.state_dim, self.detach_value = fast, state_dim, detach_value
        self.chunk_size, self.action_dim = fast.chunk_size, fast.action_dim
        self.execute_steps = fast.chunk_size  # token PPO executes whole chunks
        self.obs_keys = ("state",)
        self.max_tokens = max_tokens or cfg.max_action_tokens
        self.image_size = cfg.image_resolution[0]
        n_text = len(text_tokenizer)
        self.state_base, self.action_base = n_text, n_text + STATE_BINS
        self.n_actions = fast.vocab_size  # local action ids 0..n_actions-1; n_actions is <eos>
        self.bos, self.eos = text_tokenizer.bos_token_id, text_tokenizer.eos_token_id
        prompt_ids = text_tokenizer(f"Task: {prompt}, State:", add_special_tokens=False)["input_ids"]
        self.register_buffer("prompt_ids", torch.tensor(prompt_ids, dtype=torch.long), persistent=False)
        self.register_buffer("state_mean", torch.zeros(state_dim))
        self.register_buffer("state_std", torch.ones(state_dim))
        width = lerobot_policy.model.paligemma_with_expert.paligemma.config.text_config.hidden_size
        self.value_head = nn.Sequential(nn.Linear(width, value_hidden), nn.Tanh(), nn.Linear(value_hidden, 1))
        nn.init.normal_(self.value_head[-1].weight, std=0.02)
        nn.init.zeros_(self.value_head[-1].bias)

    @property
    def core(self) -> nn.Module:
        """LeRobot's PI0FastPytorch (a property, not a second submodule: weights are saved once)."""
        return self.lerobot.model

    # ------------------------------------------------------------------ inputs
    def fit_observation_stats(self, obs: dict[str, torch.Tensor]) -> None:
        state = obs["state"].float()
        self.state_mean.copy_(state.mean(0))
        self.state_std.copy_(state.std(0).clamp_min(1e-3))

    def _prompt(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """[B, L]: prompt ids, the state as 256-bin tokens (normalised state clipped to +-3 std), <bos>."""
        state = ((obs["state"].float() - self.state_mean) / self.state_std).clamp(-3.0, 3.0)
        bins = ((state + 3.0) / 6.0 * (STATE_BINS - 1)).round().long() + self.state_base
        batch = len(state)
        return torch.cat([self.prompt_ids.expand(batch, -1), bins,
                          torch.full((batch, 1), self.bos, dtype=torch.long, device=bins.device)], dim=1)

    def _lm_ids(self, local: torch.Tensor) -> torch.Tensor:
        return torch.where(local >= self.n_actions, torch.full_like(local, self.eos), local + self.action_base)

    def _forward(self, obs: dict[str, torch.Tensor], inputs: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden states from the last prompt token on [B, 1 + T, W], mean output over image + prompt tokens [B, W])
        for local action-token inputs [B, T] (or None)."""
        from lerobot.policies.common.vla_utils import prepare_attention_masks_4d

        prompt = self._prompt(obs)
        batch, device = prompt.shape[0], prompt.device
        image = obs.get("image_front")
        if image is None:  # LeRobot's empty camera: a constant image
            image = torch.zeros(batch, 3, self.image_size, self.image_size, device=device)
        else:
            image = image.float() / 127.5 - 1.0
        ones = torch.ones(batch, dtype=torch.bool, device=device)
        fast_ids = None if inputs is None or inputs.shape[1] == 0 else self._lm_ids(inputs)
        fast_mask = None if fast_ids is None else torch.ones_like(fast_ids, dtype=torch.bool)
        embs, pad, att, _, n_fast = self.core.embed_prefix_fast([image], [ones], prompt, torch.ones_like(prompt, dtype=torch.bool),
                                                                fast_action_tokens=fast_ids, fast_action_masks=fast_mask)
        (out, _), _ = self.core.paligemma_with_expert.forward(
            attention_mask=prepare_attention_masks_4d(att, dtype=embs.dtype), position_ids=torch.cumsum(pad, dim=1) - 1,
            past_key_values=None, inputs_embeds=[embs, None], use_cache=False, adarms_cond=[None, None])
        n_prefix = out.shape[1] - n_fast
        return out[:, n_prefix - 1:], out[:, :n_prefix].mean(1)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the local action vocabulary + <eos> [.., n_actions + 1] (other ids are never sampled)."""
        lm_head = self.core.paligemma_with_expert.paligemma.lm_head
        logits = lm_head(hidden)
        return torch.cat([logits[..., self.action_base:self.action_base + self.n_actions], logits[..., self.eos:self.eos + 1]],
                         dim=-1)

    # ------------------------------------------------------------------ the RL interface
    @torch.no_grad()
    def sample(self, obs: dict[str, torch.Tensor], greedy: bool = False, generator: torch.Generator | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Batch decoding over envs: (tokens [B, T], per-token log-probs [B, T], mask [B, T]) with T = max_tokens;
        tokens after <eos> are padding (mask 0, log-prob 0)."""
        batch = len(obs["state"])
        device = self.prompt_ids.device
        tokens = torch.full((batch, self.max_tokens), self.n_actions, dtype=torch.long, device=device)
        logp = torch.zeros(batch, self.max_tokens, device=device)
        mask = torch.zeros(batch, self.max_tokens, device=device)
        alive = torch.ones(batch, dtype=torch.bool, device=device)
        for t in range(self.max_tokens):
            hidden, _ = self._forward(obs, tokens[:, :t])
            dist = torch.distributions.Categorical(logits=self._logits(hidden[:, -1]))
            if greedy:
                tok = dist.logits.argmax(-1)
            else:
                tok = torch.multinomial(dist.probs, 1, generator=generator).squeeze(-1)
            tokens[:, t] = torch.where(alive, tok, tokens[:, t])
            logp[:, t] = torch.where(alive, dist.log_prob(tok), logp[:, t])
            mask[:, t] = alive.float()
            alive = alive & (tok != self.n_actions)
            if not bool(alive.any()):
                break
        return tokens, logp, mask

    def token_log_probs(self, obs: dict[str, torch.Tensor], tokens: torch.Tensor, mask: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One teacher-forced pass: (per-token log-probs [B, T] (0 on padding), entropies [B, T], values [B])."""
        hidden, prefix_mean = self._forward(obs, tokens[:, :-1])
        dist = torch.distributions.Categorical(logits=self._logits(hidden))
        logp = dist.log_prob(tokens) * mask
        return logp, dist.entropy() * mask, self._value(prefix_mean)

    def _value(self, prefix_mean: torch.Tensor) -> torch.Tensor:
        return self.value_head(prefix_mean.detach() if self.detach_value else prefix_mean).squeeze(-1)

    def value(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self._value(self._forward(obs, None)[1])

    @torch.no_grad()
    def sample_actions(self, obs: dict[str, torch.Tensor], deterministic: bool = True) -> torch.Tensor:
        """Action chunks [B, H, A]: greedy decoding (evaluation, serving) or sampled tokens."""
        tokens, _, mask = self.sample(obs, greedy=deterministic)
        return self.actions(tokens, mask)

    def actions(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Action chunks [B, H, A] decoded through the FAST tokenizer (<eos> and padding dropped)."""
        rows = []
        for toks, m in zip(tokens.cpu().numpy(), mask.cpu().numpy(), strict=True):
            ids = [int(t) for t, k in zip(toks, m, strict=True) if k > 0 and t < self.n_actions]
            rows.append(self.fast.decode(ids))
        return torch.as_tensor(np.stack(rows), device=tokens.device)

    def encode_actions(self, chunks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Demonstration chunks [B, H, A] -> (local tokens + <eos> [B, T], mask) for SFT (cut at max_tokens)."""
        tokens = torch.full((len(chunks), self.max_tokens), self.n_actions, dtype=torch.long)
        mask = torch.zeros(len(chunks), self.max_tokens)
        for i, chunk in enumerate(chunks.cpu().numpy()):
            ids = (self.fast.encode(chunk) + [self.n_actions])[:self.max_tokens]
            tokens[i, :len(ids)] = torch.tensor(ids)
            mask[i, :len(ids)] = 1.0
        return tokens.to(chunks.device), mask.to(chunks.device)

    def sft_loss(self, obs: dict[str, torch.Tensor], chunks: torch.Tensor) -> torch.Tensor:
        """Next-token cross-entropy of demonstration chunks [B, H, A] (pi0-FAST's own loss, on our tokens)."""
        tokens, mask = self.encode_actions(chunks)
        logp, _, _ = self.token_log_probs(obs, tokens, mask)
        return -logp.sum() / mask.sum().clamp_min(1.0)

    def policy_parameters(self) -> Sequence[nn.Parameter]:
        value = {id(p) for p in self.value_head.parameters()}
        return [p for p in self.parameters() if id(p) not in value]


def expert_data(task: str, envs: int = 16, steps: int = 100, horizon: int = 5, seed: int = 1,
                control_mode: str = "ee_delta") -> tuple[torch.Tensor, torch.Tensor]:
    """(states [N, S], the scripted expert's next ``horizon`` actions [N, horizon, A]) from the simulator."""
    import rlrobot

    env = rlrobot.make(task, envs, control_mode=control_mode, seed=seed)
    obs, _ = env.reset(seed=seed)
    states, actions = [], []
    for _ in range(steps):
        a = env.expert_action().clamp(-1, 1)
        states.append(obs["state"].clone())
        actions.append(a)
        obs, *_ = env.step(a)
    env.close()
    s, a = torch.stack(states, 1), torch.stack(actions, 1)
    windows = range(steps - horizon + 1)
    return torch.cat([s[:, i] for i in windows]), torch.cat([a[:, i:i + horizon] for i in windows])


def main(argv: Sequence[str] | None = None) -> None:
    """python -m rlrobot.policies.vla.pi0_fast --task so101-reach --out DIR [--sft-steps 1000]: a tiny random pi0-FAST
    whose FAST tokenizer is fitted on the scripted expert's chunks, optionally token-SFT'd on them (batch 64, Adam 1e-3),
    written as a pi0-FAST directory for --algo vla-token-ppo --vla-fast.path DIR."""
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(prog="python -m rlrobot.policies.vla.pi0_fast")
    parser.add_argument("--task", default="so101-reach")
    parser.add_argument("--out", required=True)
    parser.add_argument("--sft-steps", type=int, default=0)
    parser.add_argument("--envs", type=int, default=16, help="expert data: parallel envs")
    parser.add_argument("--steps", type=int, default=100, help="expert data: env steps per env (episodes back to back)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    states, chunks = expert_data(args.task, envs=args.envs, steps=args.steps)
    if args.sft_steps <= 0:
        print(build_tiny_pi0_fast(args.out, states.shape[1], chunks.numpy(), args.task, max_action_tokens=16,
                                  fast_vocab=128, seed=args.seed))
        return
    base = build_tiny_pi0_fast(Path(tempfile.mkdtemp()) / "base", states.shape[1], chunks.numpy(), args.task,
                               max_action_tokens=16, fast_vocab=128, seed=args.seed)
    policy = load_pi0_fast(base)
    policy.fit_observation_stats({"state": states})
    opt = torch.optim.Adam(policy.policy_parameters(), lr=1e-3)
    for step in range(args.sft_steps):
        idx = torch.randint(0, len(states), (64,))
        loss = policy.sft_loss({"state": states[idx]}, chunks[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 100 == 0 or step == args.sft_steps - 1:
            print(f"sft step {step}: token cross-entropy {loss.item():.3f}", flush=True)
    print(save_pi0_fast(policy, base, args.out))


if __name__ == "__main__":
    main()
