"""Tiny random pi0 / pi0.5 / SmolVLA checkpoints, built offline (no hub, no weights download): LeRobot's own classes
with shrunken backbones, saved with LeRobot's ``save_pretrained`` so they load like a user's checkpoint.

* pi0 / pi0.5: the config validates the Gemma variant names, so the modeling module's ``get_gemma_config`` is replaced
  by one returning a small Gemma (num_heads stays 8: LeRobot reshapes to 8 heads), and the PaliGemma / expert
  constructors are wrapped to shrink SigLIP, the vocabulary and the unused expert LM head before allocation. The sizes
  are written to ``rlrobot_tiny.json`` so that loading rebuilds the same shapes.
* SmolVLA: a tiny ``SmolVLMConfig`` + processor written into ``DIR/vlm`` (``load_vlm_weights=False``).
* The tokenizer: a byte-level BPE trained in-process on the instructions, saved in ``DIR/tokenizer``.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from .load import TINY_MARKER, policy_class

SPECIAL = {"pad_token": "<pad>", "unk_token": "<unk>", "bos_token": "<bos>", "eos_token": "<eos>"}
SMOLVLM_SPECIAL = {"image_token": "<image>", "fake_image_token": "<fake_token_around_image>",
                   "global_image_token": "<global-img>"}
DEFAULT_SIZES = {"width": 64, "depth": 2, "mlp": 128, "head_dim": 16, "image": 32, "vision_hidden": 32,
                 "vision_mlp": 64, "patch": 8}


def make_tokenizer(texts: Sequence[str], vocab_size: int = 400):
    """A byte-level BPE trained on ``texts`` (plus digits and pi0.5's prompt words), as a PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=SPECIAL["unk_token"]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = [*SPECIAL.values(), *SMOLVLM_SPECIAL.values()]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    corpus = [*texts, "Task: State: ;\nAction: ", " ".join(str(i) for i in range(256))]
    tok.train_from_iterator(corpus, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", tok.token_to_id("<bos>"))])
    return PreTrainedTokenizerFast(tokenizer_object=tok, extra_special_tokens=dict(SMOLVLM_SPECIAL), **SPECIAL)


@contextmanager
def tiny_patches(variant: str, sizes: dict[str, Any]) -> Iterator[None]:
    """pi0 / pi0.5 modules build the shrunken Gemma / SigLIP while inside (SmolVLA needs none)."""
    if variant == "smolvla":
        yield
        return
    mod = importlib.import_module(f"lerobot.policies.{variant}.modeling_{variant}")
    small = mod.GemmaConfig(width=sizes["width"], depth=sizes["depth"], mlp_dim=sizes["mlp"], num_heads=8,
                            num_kv_heads=1, head_dim=sizes["head_dim"])
    orig = (mod.get_gemma_config, mod.PaliGemmaForConditionalGenerationWithPiGemma, mod.PiGemmaForCausalLM)

    def paligemma(config):
        vision = config.vision_config
        vision.hidden_size, vision.intermediate_size = sizes["vision_hidden"], sizes["vision_mlp"]
        vision.num_hidden_layers, vision.num_attention_heads = 1, 2
        vision.patch_size, vision.image_size = sizes["patch"], sizes["image"]
        vision.projection_dim = sizes["width"]  # LeRobot hard-codes 2048, the text width of gemma_2b
        config.text_config.vocab_size = sizes["vocab"]
        config._vocab_size = sizes["vocab"]
        config.image_token_index = sizes["vocab"] - 1
        return orig[1](config=config)

    def expert(config):
        config.vocab_size = sizes["vocab"]  # the expert's LM head is never used
        return orig[2](config=config)

    mod.get_gemma_config = lambda variant_name: small
    mod.PaliGemmaForConditionalGenerationWithPiGemma = paligemma
    mod.PiGemmaForCausalLM = expert
    try:
        yield
    finally:
        mod.get_gemma_config, mod.PaliGemmaForConditionalGenerationWithPiGemma, mod.PiGemmaForCausalLM = orig


def _features(obs_shapes: dict[str, Sequence[int]], action_dim: int) -> tuple[dict, dict]:
    from lerobot.configs.types import FeatureType, PolicyFeature

    inputs = {}
    for key, shape in obs_shapes.items():
        if key == "state":
            inputs["observation.state"] = PolicyFeature(type=FeatureType.STATE, shape=tuple(shape))
        elif key.startswith("image_"):
            inputs["observation.images." + key.removeprefix("image_")] = PolicyFeature(type=FeatureType.VISUAL,
                                                                                       shape=tuple(shape))
    return inputs, {"action": PolicyFeature(type=FeatureType.ACTION, shape=(action_dim,))}


def _smolvlm_dir(out: Path, tokenizer, sizes: dict[str, Any]) -> Path:
    """A tiny SmolVLM config + processor (no weights: SmolVLA builds the VLM from the config)."""
    from transformers import SmolVLMConfig, SmolVLMImageProcessor, SmolVLMProcessor, SmolVLMVideoProcessor

    vlm = out / "vlm"
    text = {"hidden_size": sizes["width"], "intermediate_size": sizes["mlp"], "num_hidden_layers": sizes["depth"],
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": sizes["width"] // 4,
            "vocab_size": len(tokenizer), "max_position_embeddings": 512, "model_type": "llama"}
    vision = {"hidden_size": sizes["vision_hidden"], "intermediate_size": sizes["vision_mlp"], "num_hidden_layers": 1,
              "num_attention_heads": 2, "image_size": sizes["image"], "patch_size": sizes["patch"]}
    cfg = SmolVLMConfig(text_config=text, vision_config=vision, scale_factor=2,
                        image_token_id=tokenizer.convert_tokens_to_ids(SMOLVLM_SPECIAL["image_token"]))
    cfg.save_pretrained(vlm)
    image_processor = SmolVLMImageProcessor(size={"longest_edge": sizes["image"]},
                                            max_image_size={"longest_edge": sizes["image"]})
    SmolVLMProcessor(image_processor=image_processor, tokenizer=tokenizer, video_processor=SmolVLMVideoProcessor(),
                     image_seq_len=(sizes["image"] // sizes["patch"] // 2) ** 2).save_pretrained(vlm)
    return vlm


PALIGEMMA_TOKENIZER = "google/paligemma-3b-pt-224"


@contextmanager
def offline_processor_tokenizer(directory: Path) -> Iterator[None]:
    """pi0 / pi0.5's processors load the tokenizer ``google/paligemma-3b-pt-224`` from the hub: while inside, they get
    ``directory/tokenizer`` (a tiny checkpoint's own) instead."""
    from lerobot.processor import tokenizer_processor

    auto = tokenizer_processor.AutoTokenizer
    original = auto.from_pretrained

    def load(name, *args, **kwargs):
        if name == PALIGEMMA_TOKENIZER:
            return original(str(directory / "tokenizer"), local_files_only=True)
        return original(name, *args, **kwargs)

    auto.from_pretrained = load
    try:
        yield
    finally:
        auto.from_pretrained = original


def write_processors(directory: str | os.PathLike, stats: dict[str, dict[str, Any]],
                     modes: dict[str, str] | None = None) -> None:
    """LeRobot's own pre- / post-processors for the checkpoint in ``directory`` with the statistics ``stats``
    (``{"observation.state" | "action": {"mean" | "std" | "min" | "max" | "q01" | "q99" | ...: values}}``), written
    beside it with ``save_pretrained`` as ``lerobot-train`` writes them. ``modes`` overrides the checkpoint's
    normalisation modes by feature type (``{"STATE": "MIN_MAX", "ACTION": "QUANTILES"}``)."""
    from lerobot.configs.policies import PreTrainedConfig
    from lerobot.configs.types import NormalizationMode
    from lerobot.policies.factory import make_pre_post_processors

    root = Path(directory)
    cfg = PreTrainedConfig.from_pretrained(str(root), local_files_only=True)
    if modes:
        cfg.normalization_mapping = {**cfg.normalization_mapping, **{k: NormalizationMode(v) for k, v in modes.items()}}
    tensors = {feature: {name: torch.as_tensor(values, dtype=torch.float32) for name, values in by_stat.items()}
               for feature, by_stat in stats.items()}
    with offline_processor_tokenizer(root):
        pre, post = make_pre_post_processors(cfg, dataset_stats=tensors)
    pre.save_pretrained(str(root))
    post.save_pretrained(str(root))


def build_tiny(variant: str, out_dir: str | os.PathLike, obs_shapes: dict[str, Sequence[int]], action_dim: int,
               instructions: Sequence[str], chunk_size: int = 5, denoising_steps: int = 4, seed: int = 0,
               sizes: dict[str, Any] | None = None) -> Path:
    """Write a tiny random LeRobot ``variant`` checkpoint for our spaces into ``out_dir`` (LeRobot's save_pretrained +
    tokenizer/ + rlrobot_tiny.json) and return the directory. Offline and deterministic under ``seed``."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = make_tokenizer(instructions)
    sizes = {**DEFAULT_SIZES, **(sizes or {}), "vocab": len(tokenizer)}
    inputs, outputs = _features(obs_shapes, action_dim)
    state_dim = max([s[0] for k, s in obs_shapes.items() if k == "state"] + [8])
    common = {"input_features": inputs, "output_features": outputs, "chunk_size": chunk_size,
              "n_action_steps": chunk_size, "device": "cpu", "max_state_dim": max(32, state_dim), "max_action_dim": 32}
    torch.manual_seed(seed)
    if variant in ("pi0", "pi05"):
        cfg_mod = importlib.import_module(f"lerobot.policies.{variant}.configuration_{variant}")
        cfg_cls = cfg_mod.PI0Config if variant == "pi0" else cfg_mod.PI05Config
        cfg = cfg_cls(**common, num_inference_steps=denoising_steps, image_resolution=(sizes["image"], sizes["image"]),
                      dtype="float32", tokenizer_max_length=48 if variant == "pi0" else 96)
    elif variant == "smolvla":
        from lerobot.policies.smolvla.configuration_smolvla import SmolVLAConfig

        vlm = _smolvlm_dir(out, tokenizer, sizes)
        cfg = SmolVLAConfig(**common, num_steps=denoising_steps, vlm_model_name=str(vlm), load_vlm_weights=False,
                            resize_imgs_with_padding=(sizes["image"], sizes["image"]), num_vlm_layers=sizes["depth"],
                            tokenizer_max_length=48)
    else:
        raise ValueError(f"variant={variant!r} is not one of ('pi0', 'pi05', 'smolvla')")
    with tiny_patches(variant, sizes):
        policy = policy_class(variant)(cfg)
    policy.save_pretrained(out)
    tokenizer.save_pretrained(out / "tokenizer")
    (out / TINY_MARKER).write_text(json.dumps(sizes, indent=1))
    return out


def main(argv: Sequence[str] | None = None) -> None:
    """python -m rlrobot.policies.vla.tiny --variant pi0 --task so101-reach --out DIR: a tiny random checkpoint whose
    features are the task's (state, every camera, the action of --control-mode), to try the VLA pipeline offline
    (vla-sft, then vla-flow-noise / vla-flow-sde with --vla.path DIR)."""
    import argparse

    from rlrobot.tasks.registry import make

    parser = argparse.ArgumentParser(prog="python -m rlrobot.policies.vla.tiny")
    parser.add_argument("--variant", required=True, choices=("pi0", "pi05", "smolvla"))
    parser.add_argument("--task", default="so101-reach")
    parser.add_argument("--out", required=True)
    parser.add_argument("--obs-mode", default="state+rgb")
    parser.add_argument("--control-mode", default="joint_pos")
    parser.add_argument("--chunk-size", type=int, default=5)
    parser.add_argument("--denoising-steps", type=int, default=4)
    parser.add_argument("--width", type=int, default=DEFAULT_SIZES["width"], help="VLM and action-expert width")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stats", default="", help="a JSON file {feature: {stat: values}} (features observation.state "
                        "and action; stats mean/std, min/max, q01/q99): LeRobot's processors written with them")
    args = parser.parse_args(argv)
    stats = json.loads(Path(args.stats).read_text()) if args.stats else None
    env = make(args.task, 1, obs_mode=args.obs_mode, control_mode=args.control_mode)
    shapes = {k: list(v.shape) for k, v in env.single_observation_space.spaces.items()}
    action_dim, instructions = int(env.single_action_space.shape[0]), list(env.instruction)
    env.close()
    out = build_tiny(args.variant, args.out, shapes, action_dim, instructions, chunk_size=args.chunk_size,
                     denoising_steps=args.denoising_steps, seed=args.seed, sizes={"width": args.width})
    if stats is not None:
        write_processors(out, stats)
    from safetensors import safe_open

    with safe_open(out / "model.safetensors", "pt") as weights:
        count = sum(torch.Size(weights.get_slice(name).get_shape()).numel() for name in weights.keys())
    print(f"{out} ({count:,} parameters)")


if __name__ == "__main__":
    main()
