"""VLA runs that do not depend on their base directory, and their export back to LeRobot.

* ``copy_base``: a VLA run keeps in its own directory (``RUN/lerobot_base``) everything of ``--vla.path`` but the
  weights (which the run's checkpoints hold in full): LeRobot's config.json, the processor files, the tokenizer (saved
  from the loaded one, so a tokenizer taken from the Hugging Face cache travels too), a local VLM config directory
  (SmolVLA's ``vlm_model_name``) and ``rlrobot_tiny.json``. ``rlrobot eval / serve / deploy / --init`` then load the
  architecture from that copy (``checkpoints.load_checkpoint`` points ``vla.path`` there) and the weights from the run,
  so the base directory may move or be deleted.
* ``export_lerobot``: a run's policy as a LeRobot pretrained directory: LeRobot's ``save_pretrained`` of the wrapped
  policy (LoRA merged into the base weights), its processors with the run's statistics (the state normalisation the
  run used, the checkpoint's action un-normalisation), loadable by LeRobot's ``from_pretrained`` and
  ``make_pre_post_processors(pretrained_path=...)``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from .processors import NORMALIZER, PREPROCESSOR, RANGE_STATS, STATE

RUN_COPY = "lerobot_base"
"""the folder of a VLA run that holds its base checkpoint's files (all but the weights)"""
COPY_MARKER = "rlrobot_base_copy.json"
"""written into such a copy: where it came from, and that its weights are the run's"""
VLM_FOLDER = "vlm_model"
"""SmolVLA's VLM config / processor inside a copy or an export"""


def is_base_copy(path: str | Path) -> bool:
    return (Path(path) / COPY_MARKER).is_file()


def base_copy_source(path: str | Path) -> Path | None:
    """The base directory a run's copy was made from (None for any other directory)."""
    return Path(json.loads((Path(path) / COPY_MARKER).read_text())["source"]) if is_base_copy(path) else None


def resolve_vlm_name(root: Path, name: str) -> str:
    """SmolVLA's ``vlm_model_name`` as a copy or export stores it (a folder relative to the directory) made absolute."""
    return str(root / name) if name and not Path(name).is_absolute() and (root / name).is_dir() else name


def _copy_vlm(config: dict[str, Any], source: Path, dest: Path) -> None:
    """SmolVLA's VLM config + processor kept in ``dest`` (a folder inside ``source`` is already there; another local
    folder is copied; a hub id is saved from the local Hugging Face cache where it is there), ``vlm_model_name`` made
    that folder's name relative to ``dest``; LeRobot's tokenizer step (which SmolVLA's processor points at the same
    name) follows it."""
    name = config.get("vlm_model_name")
    if not name:
        return
    local = Path(resolve_vlm_name(source, name))
    if local.is_dir() and local.resolve().is_relative_to(source.resolve()):
        folder = str(local.resolve().relative_to(source.resolve()))
    elif local.is_dir():
        folder = VLM_FOLDER
        shutil.copytree(local, dest / folder, dirs_exist_ok=True)
    else:
        try:
            from transformers import AutoConfig, AutoProcessor

            AutoConfig.from_pretrained(name, local_files_only=True).save_pretrained(dest / VLM_FOLDER)
            AutoProcessor.from_pretrained(name, local_files_only=True).save_pretrained(dest / VLM_FOLDER)
        except (OSError, ValueError):
            return  # not in the local cache: the copy keeps the hub id (it loads where the cache has it)
        folder = VLM_FOLDER
    config["vlm_model_name"] = folder
    set_tokenizer_name(dest, folder)


def set_tokenizer_name(directory: Path, name: str) -> None:
    """The tokenizer step of ``directory``'s preprocessor loads ``name``."""
    pipeline_file = directory / PREPROCESSOR
    if not pipeline_file.is_file():
        return
    pipeline = json.loads(pipeline_file.read_text())
    for step in pipeline.get("steps", []):
        if step.get("registry_name") == "tokenizer_processor" and "tokenizer_name" in step.get("config", {}):
            step["config"]["tokenizer_name"] = name
    pipeline_file.write_text(json.dumps(pipeline, indent=4))


def copy_base(source: str | Path, dest: str | Path, tokenizer: Any) -> Path:
    """Copy ``source`` (a LeRobot pretrained directory, or another run's copy) into ``dest`` without its weights,
    atomically (a complete copy or none); an existing ``dest`` is kept (a resumed run)."""
    source, dest = Path(source), Path(dest)
    if is_base_copy(dest):
        return dest
    tmp = dest.with_name(f".{dest.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(source, tmp, ignore=lambda folder, names: ["model.safetensors"] if Path(folder) == source else [])
    config = json.loads((source / "config.json").read_text())
    if config.get("type") == "smolvla" and not is_base_copy(source):
        _copy_vlm(config, source, tmp)
    (tmp / "config.json").write_text(json.dumps(config, indent=4))
    if not (tmp / "tokenizer").is_dir():
        tokenizer.save_pretrained(str(tmp / "tokenizer"))
    origin = json.loads((source / COPY_MARKER).read_text())["source"] if is_base_copy(source) else str(source.resolve())
    (tmp / COPY_MARKER).write_text(json.dumps({"source": origin, "weights": "the run's checkpoints (model.safetensors)"}))
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


def _state_statistics(policy, mode: str, eps: float) -> dict[str, torch.Tensor]:
    """The policy's state normalisation ``(x - state_mean) / state_std`` as LeRobot statistics of ``mode``."""
    shift, scale = policy.state_mean.detach().float().cpu(), policy.state_std.detach().float().cpu()
    if mode == "MEAN_STD":
        return {"mean": shift, "std": scale - eps}  # LeRobot divides by std + eps
    low, high = RANGE_STATS[mode]
    return {low: shift - scale, high: shift + scale}


def write_state_statistics(directory: Path, policy) -> None:
    """Replace the state's statistics in the normaliser step's file by the policy's (the run's own: vla-sft fits them
    on its dataset); a directory whose preprocessor has no state normalisation gets MEAN_STD statistics added."""
    from safetensors.torch import load_file, save_file

    pipeline_file = directory / PREPROCESSOR
    if not hasattr(policy, "state_mean") or not pipeline_file.is_file():
        return
    pipeline = json.loads(pipeline_file.read_text())
    steps = [s for s in pipeline.get("steps", []) if s.get("registry_name") == NORMALIZER]
    if not steps:
        return
    step = steps[0]
    config = step.setdefault("config", {})
    mode = config.get("norm_map", {}).get("STATE", "IDENTITY")
    if mode == "IDENTITY":
        mode = "MEAN_STD"
        config.setdefault("norm_map", {})["STATE"] = mode
    if not step.get("state_file"):
        step["state_file"] = PREPROCESSOR.removesuffix(".json") + f"_step_{pipeline['steps'].index(step)}_{NORMALIZER}.safetensors"
    state_file = directory / step["state_file"]
    tensors = load_file(state_file) if state_file.is_file() else {}
    tensors = {k: v for k, v in tensors.items() if not k.startswith(STATE + ".")}
    for stat, value in _state_statistics(policy, mode, float(config.get("eps", 1e-8))).items():
        tensors[f"{STATE}.{stat}"] = value.contiguous()
    save_file(tensors, state_file)
    pipeline_file.write_text(json.dumps(pipeline, indent=2))


def write_processors_from_policy(directory: Path, policy) -> None:
    """LeRobot's pre- / post-processors for ``directory`` with the statistics the policy applies (each mode's)."""
    from .tiny import write_processors

    stats: dict[str, dict[str, list[float]]] = {}
    for feature, shift, scale in ((STATE, "state_mean", "state_std"), ("action", "action_shift", "action_scale")):
        if not hasattr(policy, shift):
            continue
        mid, half = getattr(policy, shift).detach().float().cpu(), getattr(policy, scale).detach().float().cpu()
        stats[feature] = {"mean": mid.tolist(), "std": half.tolist()}
        for low, high in RANGE_STATS.values():
            stats[feature].update({low: (mid - half).tolist(), high: (mid + half).tolist()})
    write_processors(directory, stats)


def merged_lerobot_policy(policy) -> torch.nn.Module:
    """A copy of the adapter's LeRobot policy with every LoRA layer merged into its base layer (plain modules again)."""
    import copy

    lerobot_policy = copy.deepcopy(policy.lerobot)
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:
        return lerobot_policy
    for name, module in list(lerobot_policy.named_modules()):
        if isinstance(module, LoraLayer):
            module.merge()
            parent_name, _, child = name.rpartition(".")
            setattr(lerobot_policy.get_submodule(parent_name) if parent_name else lerobot_policy, child,
                    module.get_base_layer())
    return lerobot_policy


def lora_adapter(policy, base: Path):
    """A PEFT model over the base checkpoint's own weights holding the run's LoRA adapters and, as ``modules_to_save``,
    the projections a LoRA run trains in full: what LeRobot's ``use_peft`` loading rebuilds. Refuses a run whose other
    weights differ from the base's (they would be lost)."""
    from peft import LoraConfig, get_peft_model

    from .load import LORA_TRAINED_IN_FULL, load_lerobot_policy

    cfg = policy.vla_cfg
    if not cfg.lora_rank:
        raise ValueError("lora_only: this run trained no LoRA adapters (vla.lora_rank=0); export the full weights")
    if not (base / "model.safetensors").is_file():
        raise ValueError(f"lora_only: the adapter names its base checkpoint, and {base} (the run's --vla.path) has no "
                         "model.safetensors any more; export the full weights instead")
    fresh = load_lerobot_policy(str(base), json.loads((base / "config.json").read_text())["type"])
    heads = [n for n in LORA_TRAINED_IN_FULL if hasattr(fresh.model, n)]
    peft_model = get_peft_model(fresh, LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                                                  target_modules=list(cfg.lora_targets), modules_to_save=heads))
    ours = policy.state_dict()
    changed, loaded = [], {}
    for name, tensor in peft_model.state_dict().items():
        inner = "lerobot." + name.removeprefix("base_model.model.")
        if "lora_" in name or ".modules_to_save.default." in name:
            loaded[name] = ours[inner.replace(".modules_to_save.default", "")]
        elif ".original_module." not in name and inner in ours and not torch.equal(ours[inner].to(tensor), tensor):
            changed.append(inner.removeprefix("lerobot."))
    if changed:
        raise ValueError(f"lora_only: the run's weights outside its LoRA adapters differ from {base}'s ({changed[:3]}, "
                         f"{len(changed)} in all); export the full weights")
    peft_model.load_state_dict(loaded, strict=False)
    peft_model.peft_config["default"].base_model_name_or_path = str(base.resolve())
    return peft_model


def export_lerobot(policy, base: str | Path, out: str | Path, lora_only: bool = False) -> Path:
    """Write ``policy`` (a built ``vla`` adapter with the run's weights) into ``out`` as a LeRobot pretrained directory;
    ``base`` is the directory it was built from (its processor files and tokenizer come along). ``lora_only``: the
    LoRA adapters (and the projections trained in full) as a PEFT adapter over the original base checkpoint, with
    ``use_peft`` set, as ``lerobot-train --peft`` writes them (the base directory must stay where it is)."""
    base, out = Path(base), Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"out={str(out)!r} exists and is not empty; give a new directory")
    adapter = lora_adapter(policy, base_copy_source(base) or base) if lora_only else None
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(base, tmp, ignore=lambda folder, names: [n for n in names if n in ("model.safetensors", COPY_MARKER)]
                    if Path(folder) == base else [])
    if adapter is not None:
        adapter.save_pretrained(str(tmp))
        adapter.base_model.model.config.use_peft = True
        adapter.base_model.model.config._save_pretrained(tmp)
    else:
        merged_lerobot_policy(policy).save_pretrained(str(tmp))
    config = json.loads((tmp / "config.json").read_text())
    if config.get("type") == "smolvla":
        _copy_vlm(config, base, tmp)
        if (tmp / config["vlm_model_name"]).is_dir():  # LeRobot reads the VLM from the name as given: absolute
            config["vlm_model_name"] = str(out.resolve() / config["vlm_model_name"])
            set_tokenizer_name(tmp, config["vlm_model_name"])
    (tmp / "config.json").write_text(json.dumps(config, indent=4))
    if not (tmp / "tokenizer").is_dir():
        policy.tokenizer.save_pretrained(str(tmp / "tokenizer"))
    if (tmp / PREPROCESSOR).is_file():
        write_state_statistics(tmp, policy)
    else:  # a base without processor files: LeRobot's own, with the statistics the policy applies
        write_processors_from_policy(tmp, policy)
    if out.exists():
        out.rmdir()
    tmp.rename(out)
    return out
