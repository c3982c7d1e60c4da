"""Building a VLA adapter from a LeRobot pretrained directory on local disk (never a hub id): config and features
checked first, then LeRobot's own ``from_pretrained`` offline, the tokenizer in-process, LoRA (peft) if asked."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from .config import EXTRA_HINT, VLAConfig, check_features, chunk_and_steps, read_pretrained_config
from .processors import read_normalisation

TINY_MARKER = "rlrobot_tiny.json"
"""written by ``policies.vla.tiny``: the shrunken sizes a tiny random checkpoint must be rebuilt with"""


def require_lerobot() -> None:
    """A one-line error naming the extra when lerobot (or its VLA dependencies) is missing."""
    try:
        import lerobot  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        raise ImportError(f"VLA policies need LeRobot: {EXTRA_HINT} ({e})") from e


def policy_class(variant: str) -> type:
    require_lerobot()
    if variant == "pi0":
        from lerobot.policies.pi0.modeling_pi0 import PI0Policy

        return PI0Policy
    if variant == "pi05":
        from lerobot.policies.pi05.modeling_pi05 import PI05Policy

        return PI05Policy
    from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy

    return SmolVLAPolicy


def adapter_class(variant: str) -> type:
    from .pi0 import PI0Adapter
    from .pi05 import PI05Adapter
    from .smolvla import SmolVLAAdapter

    return {"pi0": PI0Adapter, "pi05": PI05Adapter, "smolvla": SmolVLAAdapter}[variant]


def load_tokenizer(path: Path, variant: str, lerobot_cfg) -> Any:
    """``DIR/tokenizer`` if the directory has one (tiny checkpoints, or put one there), else the tokenizer LeRobot's
    processor names, from the local Hugging Face cache only."""
    from transformers import AutoTokenizer

    local = path / "tokenizer"
    if local.is_dir():
        return AutoTokenizer.from_pretrained(str(local), local_files_only=True)
    name = lerobot_cfg.vlm_model_name if variant == "smolvla" else "google/paligemma-3b-pt-224"
    try:
        return AutoTokenizer.from_pretrained(name, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ValueError(f"vla.path={str(path)!r}: no tokenizer/ folder in it and {name!r} is not in the local Hugging Face "
                         f"cache; save the tokenizer into {local}") from e


def load_lerobot_policy(path: str, variant: str, device: str | torch.device = "cpu") -> torch.nn.Module:
    """LeRobot's ``from_pretrained`` on a local directory, offline (tiny random checkpoints rebuilt at their size)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    require_lerobot()  # the extra's one-line error before LeRobot's own imports
    from contextlib import nullcontext

    from lerobot.configs.policies import PreTrainedConfig

    from .portable import is_base_copy, resolve_vlm_name

    root = Path(path)
    marker = root / TINY_MARKER
    cls = policy_class(variant)
    config = PreTrainedConfig.from_pretrained(str(root), local_files_only=True)
    if getattr(config, "vlm_model_name", None):  # a run's copy or an export keeps its VLM config in a folder of its own
        config.vlm_model_name = resolve_vlm_name(root, config.vlm_model_name)
    if marker.is_file():
        from .tiny import tiny_patches

        patches = tiny_patches(variant, json.loads(marker.read_text()))
    else:
        patches = nullcontext()
    with patches:
        if is_base_copy(root):  # a run's copy of its base: the architecture only, the weights are the run's
            if hasattr(config, "load_vlm_weights"):
                config.load_vlm_weights = False
            policy = cls(config)
        else:
            policy = cls.from_pretrained(str(root), config=config, local_files_only=True)
    return policy.to(device)


LORA_TRAINED_IN_FULL = ("action_in_proj", "action_out_proj", "state_proj", "action_time_mlp_in", "action_time_mlp_out",
                        "time_mlp_in", "time_mlp_out")
"""the core model's projections that train in full beside the LoRA adapters"""


def apply_lora(policy: torch.nn.Module, cfg: VLAConfig) -> None:
    """LoRA adapters (peft) on the VLM / expert projections; the base weights freeze, the adapters, the action / state /
    time projections and our heads train."""
    try:
        from peft import LoraConfig, inject_adapter_in_model
    except ImportError as e:
        raise ImportError(f"vla.lora_rank > 0 needs peft: pip install peft ({e})") from e
    model = policy.model
    inject_adapter_in_model(LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, target_modules=list(cfg.lora_targets),
                                       lora_dropout=0.0), model)
    for name, p in model.named_parameters():
        head = name.split(".")[0] in LORA_TRAINED_IN_FULL
        p.requires_grad_("lora_" in name or head)


def build_vla(meta: dict[str, Any], cfg: VLAConfig) -> torch.nn.Module:
    """The registry's builder: refuse a checkpoint that does not fit the task's spaces, then load it."""
    ckpt = read_pretrained_config(cfg.path)
    variant = cfg.variant or ckpt["type"]
    if variant != ckpt["type"]:
        raise ValueError(f"vla.variant={variant!r} but {cfg.path!r} holds a {ckpt['type']!r} policy")
    space = {k: list(v) for k, v in meta["observation_space"].items()}
    check_features(ckpt, space, int(meta["action_dim"]))
    chunk, steps = chunk_and_steps(ckpt)
    if cfg.chunk_size not in (0, chunk):
        raise ValueError(f"vla.chunk_size={cfg.chunk_size} but the checkpoint's chunks have {chunk} actions")
    cfg.chunk_size, cfg.denoising_steps = chunk, cfg.denoising_steps or steps
    obs_keys = tuple(cfg.obs_keys) or tuple(k for k in ("state", *sorted(space)) if k in space and
                                            (k == "state" or k.startswith("image_")))
    missing = [k for k in obs_keys if k not in space]
    if missing:
        raise ValueError(f"vla.obs_keys {missing} are not observations of this task; it has {sorted(space)}")
    normalisation = read_normalisation(cfg.path)  # the checkpoint's processor statistics (refusals before loading)
    lerobot_policy = load_lerobot_policy(cfg.path, variant)
    if variant == "smolvla":
        lerobot_policy.config.use_cache = True  # the adapter computes the prefix cache once per observation
    if cfg.gradient_checkpointing and hasattr(lerobot_policy.model, "gradient_checkpointing_enable"):
        lerobot_policy.model.gradient_checkpointing_enable()
    if cfg.lora_rank:
        apply_lora(lerobot_policy, cfg)
    tokenizer = load_tokenizer(Path(cfg.path), variant, lerobot_policy.config)
    state_dim = space["state"][0] if "state" in obs_keys else None
    policy = adapter_class(variant)(lerobot_policy, cfg, obs_keys, state_dim, int(meta["action_dim"]), tokenizer)
    policy.set_normalisation(normalisation)
    return policy.float()
