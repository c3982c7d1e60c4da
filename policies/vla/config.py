"""The ``vla`` policy kind's config (``--vla.*``) and the checks on a LeRobot pretrained directory that need no
lerobot import: what it is, which variant, its chunk length and features. Bad input is refused here, before any model
is built."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rlrobot.domains import NonNegativeInt, Positive, PositiveInt
from rlrobot.envs.language import TOKENS_KEY
from rlrobot.sections import Section
from rlrobot.tasks.registry import is_adapter_task

VARIANTS = ("pi0", "pi05", "smolvla")
"""LeRobot policy types these adapters wrap (``type`` in a pretrained directory's config.json)"""
EXTRA_HINT = "pip install -e '.[vla]' (Python >= 3.12: lerobot 0.6.1)"


@dataclass
class VLAConfig(Section):
    variant: Literal["", "pi0", "pi05", "smolvla"] = ""
    """LeRobot VLA type ('' = the ``type`` of the checkpoint in --vla.path)"""
    path: str = ""
    """LeRobot pretrained directory on local disk (config.json + model.safetensors); hub ids are refused"""
    chunk_size: NonNegativeInt = 0
    """H: actions per chunk (0 = the checkpoint's chunk_size; another value is refused)"""
    denoising_steps: NonNegativeInt = 0
    """K Euler steps from t = 1 (noise) to t = 0 (0 = the checkpoint's number of inference steps)"""
    execute_steps: NonNegativeInt = 0
    """actions of each chunk executed before re-planning (0 = the whole chunk)"""
    obs_keys: tuple[str, ...] = ()
    """our observation keys the VLA reads (() = every one its features name: state and image_<camera>)"""
    instruction: str = ""
    """the task text given to the VLM ('' = the task's own instruction; on the language suite each env's own, read
    from its instruction_tokens observation)"""
    noise_hidden: tuple[PositiveInt, ...] = (128, 64)
    """Flow-Noise head on the action expert's per-token features (pi_RL)"""
    noise_std_min: Positive = 0.08
    """lower bound of the Flow-Noise step std"""
    noise_std_max: Positive = 0.16
    """upper bound of the Flow-Noise step std"""
    value_hidden: tuple[PositiveInt, ...] = (512, 256, 128)
    """value head (pi_RL): pi0 on the expert's features, pi0.5 and SmolVLA on the VLM's prefix output"""
    detach_critic: bool = True
    """the value loss does not reach the VLA's weights"""
    lora_rank: NonNegativeInt = 0
    """LoRA rank on the VLM and expert attention / MLP projections (0 = full fine-tuning); needs peft"""
    lora_alpha: Positive = 16.0
    """LoRA scaling alpha"""
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    """module names that get LoRA adapters"""
    gradient_checkpointing: bool = False
    """recompute VLM / expert activations in the backward pass (memory for time)"""
    bf16: bool = True
    """bf16 autocast on CUDA (ignored on CPU)"""

    def observation_keys(self, run) -> tuple[str, ...] | None:
        return tuple(self.obs_keys) or None  # chosen from the checkpoint's features when the run is prepared

    def validate(self, run=None) -> None:
        """The values alone, and with ``run`` against the rest of the run. An empty ``path`` is the algorithm's to
        refuse (a fine-tuning run adopts its ``--init`` run's in ``prepare``)."""
        if self.variant not in ("", *VARIANTS):
            raise ValueError(f"vla.variant={self.variant!r} is not one of {VARIANTS} ('' = the checkpoint's)")
        for name in ("chunk_size", "denoising_steps", "execute_steps", "lora_rank"):
            if getattr(self, name) < 0:
                raise ValueError(f"vla.{name} must be >= 0, got {getattr(self, name)}")
        if self.chunk_size and self.execute_steps > self.chunk_size:
            raise ValueError(f"vla.execute_steps={self.execute_steps} must be in [0, vla.chunk_size={self.chunk_size}]")
        if not 0 < self.noise_std_min <= self.noise_std_max:
            raise ValueError(f"vla.noise_std_min / noise_std_max must satisfy 0 < min <= max, got "
                             f"{self.noise_std_min} / {self.noise_std_max}")
        if self.lora_rank and not self.lora_targets:
            raise ValueError("vla.lora_targets must name at least one module when vla.lora_rank > 0")

        if run is None:
            return
        images = [k for k in self.obs_keys if k.startswith("image_")]
        if images and run.obs_mode not in ("rgb", "state+rgb"):
            raise ValueError(f"the VLA reads cameras {images}: set obs_mode='state+rgb' (got obs_mode={run.obs_mode!r})")
        if "state" in self.obs_keys and run.obs_mode == "rgb":
            raise ValueError("the VLA reads observation.state: set obs_mode='state+rgb' (got obs_mode='rgb')")
        episode = run.episode_steps()
        if episode and self.chunk_size > episode:
            raise ValueError(f"vla.chunk_size={self.chunk_size} is larger than the episode of {run.task} ({episode} steps)")


def looks_like_hub_id(path: str) -> bool:
    return not Path(path).exists() and path.count("/") == 1 and not path.startswith((".", "/", "~"))


def read_pretrained_config(path: str) -> dict[str, Any]:
    """config.json of a LeRobot pretrained directory, or a one-line error: missing, a hub id, not a LeRobot VLA."""
    if not path:
        raise ValueError("vla.path is empty: pass --vla.path DIR, a LeRobot pretrained directory on local disk")
    if looks_like_hub_id(path):
        raise ValueError(f"vla.path={path!r} looks like a Hugging Face hub id: rlrobot loads VLAs from local disk only; "
                         f"download it first (e.g. `hf download {path} --local-dir DIR`) and pass --vla.path DIR")
    root = Path(path).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"vla.path={path!r} is not a directory")
    cfg_file = root / "config.json"
    if not cfg_file.is_file():
        raise ValueError(f"vla.path={path!r} is not a LeRobot pretrained policy: no config.json")
    try:
        cfg = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"vla.path={path!r}: config.json is not JSON ({e})") from e
    if cfg.get("type") not in VARIANTS:
        what = f"type {cfg.get('type')!r}" if "type" in cfg else "no 'type' field (an rlrobot run? use --init)"
        raise ValueError(f"vla.path={path!r} is not a LeRobot pi0 / pi05 / smolvla policy: its config.json has {what}")
    if not (root / "model.safetensors").is_file() and not (root / "rlrobot_base_copy.json").is_file():
        raise ValueError(f"vla.path={path!r} has no model.safetensors (a LeRobot pretrained directory has both)")
    return cfg


def checkpoint_features(cfg: dict[str, Any]) -> tuple[dict[str, list[int]], int]:
    """(our observation key -> shape, action dim) that a LeRobot config's features name: ``observation.state`` ->
    ``state``, ``observation.images.<cam>`` -> ``image_<cam>``."""
    ours: dict[str, list[int]] = {}
    for name, feat in cfg.get("input_features", {}).items():
        if name == "observation.state":
            ours["state"] = list(feat["shape"])
        elif name.startswith("observation.images."):
            ours["image_" + name.removeprefix("observation.images.")] = list(feat["shape"])
        else:
            raise ValueError(f"checkpoint input feature {name!r} has no rlrobot observation (known: observation.state, "
                             "observation.images.<camera> -> image_<camera>)")
    action = cfg.get("output_features", {}).get("action")
    if action is None:
        raise ValueError("checkpoint has no output feature 'action'")
    return ours, int(action["shape"][0])


def check_features(cfg: dict[str, Any], observation_space: dict[str, list[int]], action_dim: int) -> None:
    """Refuse a checkpoint whose features do not fit the task's spaces, naming the feature (images may differ in size:
    the VLA resizes them with padding to its own resolution)."""
    needed, ckpt_action = checkpoint_features(cfg)
    for key, shape in needed.items():
        feature = "observation.state" if key == "state" else "observation.images." + key.removeprefix("image_")
        if key not in observation_space:
            raise ValueError(f"checkpoint feature {feature!r} needs observation {key!r}, which this task does not give "
                             f"(it has {sorted(observation_space)}; cameras need obs_mode='state+rgb')")
        ours = list(observation_space[key])
        if key == "state" and ours != shape:
            raise ValueError(f"checkpoint feature 'observation.state' has shape {shape}, the task's 'state' {ours}")
        if key != "state" and (len(ours) != 3 or ours[0] != shape[0]):
            raise ValueError(f"checkpoint feature {feature!r} has shape {shape}, the task's {key!r} {ours}")
    if ckpt_action != action_dim:
        raise ValueError(f"checkpoint feature 'action' has {ckpt_action} dims, the task's action space {action_dim} "
                         "(LeRobot SO-101 policies are absolute joint positions: use --control-mode joint_pos)")


def chunk_and_steps(cfg: dict[str, Any]) -> tuple[int, int]:
    """The checkpoint's chunk length and its default number of denoising steps."""
    steps = cfg.get("num_inference_steps", cfg.get("num_steps", 10))
    return int(cfg["chunk_size"]), int(steps)


def resolve(run) -> None:
    """Fill the ``--vla`` section from the checkpoint (variant, chunk length, denoising steps, observation keys,
    instruction) and refuse what does not fit the task. Called by the VLA algorithms' ``prepare``."""
    vla = run.vla
    cfg = read_pretrained_config(vla.path)
    if vla.variant and vla.variant != cfg["type"]:
        raise ValueError(f"vla.variant={vla.variant!r} but {vla.path!r} holds a {cfg['type']!r} policy")
    vla.variant = cfg["type"]
    chunk, steps = chunk_and_steps(cfg)
    if vla.chunk_size and vla.chunk_size != chunk:
        raise ValueError(f"vla.chunk_size={vla.chunk_size} but the checkpoint's action expert was trained on chunks of "
                         f"{chunk}; leave it 0")
    vla.chunk_size = chunk
    vla.denoising_steps = vla.denoising_steps or steps
    needed, _ = checkpoint_features(cfg)
    if not vla.obs_keys:
        vla.obs_keys = tuple(needed)
    if vla.path != str(Path(vla.path).expanduser().resolve()):
        vla.path = str(Path(vla.path).expanduser().resolve())  # the run's config must find it from any directory
    if not vla.instruction and not is_adapter_task(run.task):
        from rlrobot.tasks.registry import describe_task

        task = describe_task(run.task)
        if TOKENS_KEY in task["observation"]:  # each env its own instruction (the suite): the VLA reads its token ids
            if TOKENS_KEY not in vla.obs_keys:
                vla.obs_keys = (*vla.obs_keys, TOKENS_KEY)
        else:
            vla.instruction = task["instruction"]
