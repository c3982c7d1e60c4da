"""Checkpoints: safetensors weights + the JSON config that built them, written atomically, and the reading of saved
run configs (any config version: ``upgrade_config``; one section of one: ``load_section``).

Layout of one checkpoint directory::

    model.safetensors   policy weights (observation normaliser included)
    config.json         the run's config, the policy class, the spaces it was trained on
    trainer.safetensors the tensors of the trainer state (algorithm optimizers, RNG, env state: only needed to resume)
    trainer.json        the rest of the trainer state (counters, learning rate, ...) with references to those tensors
    replay.safetensors  (off-policy runs with --sac.save-replay) the replay buffer, so a resume starts warm
    checksums.json      SHA-256 of every file above: loading names a damaged file, --resume skips damaged checkpoints

A directory is complete or absent: it is written under a temporary name and renamed, then ``latest`` (a text
file) is replaced atomically to point at it. Files are readable by the group (like the rest of a run directory).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

LATEST = "latest"
CHECKSUMS = "checksums.json"
CONFIG_VERSION = 3
"""config.json format: 3 = a section per reward kind (``reward.prm.scale``); 2 = a section per algorithm; 1 = one flat
run config (``upgrade_config`` reads them all)."""


class CheckpointError(ValueError):
    """A checkpoint file is missing, truncated or altered (the message names the file)."""


TRAINER_FORMAT = 2
"""trainer.json layout: 2 = one nested state (``split_tensors``) from the algorithms' ``state_dict``; 1 = before."""


def split_tensors(obj: Any, prefix: str, tensors: dict[str, torch.Tensor]) -> Any:
    """A nested state (dicts, lists, tensors, scalars; e.g. an optimizer's state_dict) as JSON with each tensor
    replaced by ``{"__tensor__": key}`` and stored in ``tensors[key]``. Dicts with non-string keys (optimizer state
    is keyed by parameter index) keep their key types."""
    if isinstance(obj, torch.Tensor):
        tensors[prefix] = obj.detach().contiguous().cpu()
        return {"__tensor__": prefix}
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj):
            return {k: split_tensors(v, f"{prefix}.{k}", tensors) for k, v in obj.items()}
        return {"__int_keys__": {str(k): split_tensors(v, f"{prefix}.{k}", tensors) for k, v in obj.items()}}
    if isinstance(obj, (list, tuple)):
        return [split_tensors(v, f"{prefix}.{i}", tensors) for i, v in enumerate(obj)]
    return obj


def join_tensors(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """Inverse of ``split_tensors``."""
    if isinstance(obj, dict):
        if set(obj) == {"__tensor__"}:
            return tensors[obj["__tensor__"]]
        if set(obj) == {"__int_keys__"}:
            return {int(k): join_tensors(v, tensors) for k, v in obj["__int_keys__"].items()}
        return {k: join_tensors(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [join_tensors(v, tensors) for v in obj]
    return obj


def save_checkpoint(
    root: str | Path,
    name: str,
    policy: torch.nn.Module,
    config: dict[str, Any],
    trainer_state: dict[str, Any] | None = None,
    keep: int = 3,
    extra_files: dict[str, dict[str, torch.Tensor]] | None = None,
) -> Path:
    """Write ``root/name`` atomically. ``trainer_state`` is a nested dict (the algorithm's state_dict, RNG, counters);
    ``extra_files`` are more safetensors files in the same directory (``{"replay": tensors}`` -> replay.safetensors)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=root))
    try:
        save_file({k: v.detach().contiguous().cpu() for k, v in policy.state_dict().items()}, tmp / "model.safetensors")
        (tmp / "config.json").write_text(json.dumps(config, indent=2, default=_json_default))
        for file_name, file_tensors in (extra_files or {}).items():
            save_file({k: v.detach().contiguous().cpu() for k, v in file_tensors.items()}, tmp / f"{file_name}.safetensors")
        if trainer_state is not None:
            tensors: dict[str, torch.Tensor] = {}
            meta = {"format": TRAINER_FORMAT, "state": split_tensors(trainer_state, "state", tensors)}
            save_file(tensors, tmp / "trainer.safetensors")
            (tmp / "trainer.json").write_text(json.dumps(meta, default=_json_default))
        sums = {f.name: _sha256(f) for f in sorted(tmp.iterdir())}
        (tmp / CHECKSUMS).write_text(json.dumps(sums, indent=1))
        _make_readable(tmp)
        final = root / name
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    pointer = root / f".{LATEST}.tmp"
    pointer.write_text(name)
    os.replace(pointer, root / LATEST)
    _prune(root, keep, protect=name)
    return final


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _make_readable(directory: Path) -> None:
    """mkdtemp makes 0700; give the checkpoint the permissions the umask gives any other new file and directory."""
    umask = os.umask(0)
    os.umask(umask)
    directory.chmod(0o777 & ~umask)
    for f in directory.iterdir():
        f.chmod(0o666 & ~umask)


def verify_checkpoint(ckpt: Path) -> None:
    """Raise CheckpointError naming the first file that is missing or whose SHA-256 differs from checksums.json.
    Checkpoints written before checksums existed are read as they are (errors still name the file)."""
    ckpt = Path(ckpt)
    sums_file = ckpt / CHECKSUMS
    if not sums_file.is_file():
        return
    sums = _read_json(sums_file)
    for name, expected in sums.items():
        path = ckpt / name
        if not path.is_file():
            raise CheckpointError(f"checkpoint file {path} is missing")
        if _sha256(path) != expected:
            raise CheckpointError(f"checkpoint file {path} is damaged (its SHA-256 differs from {CHECKSUMS}: truncated "
                                  "or altered)")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is not valid JSON ({e})") from e


def _load_tensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(path)
    except Exception as e:  # safetensors raises its own error types for truncated or garbled files
        raise CheckpointError(f"checkpoint file {path} cannot be read ({type(e).__name__}: {e})") from e


def _prune(root: Path, keep: int, protect: str) -> None:
    ckpts = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("iter_"))
    for p in ckpts[:-keep] if keep > 0 else []:
        if p.name != protect:
            shutil.rmtree(p, ignore_errors=True)


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (tuple, set)):
        return list(o)
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"cannot serialise {type(o).__name__}")


def resolve_checkpoint(path: str | Path) -> Path:
    """Accept a checkpoint directory, a checkpoints folder or a run directory; return the checkpoint directory."""
    path = Path(path)
    for candidate in (path, path / "checkpoints"):
        if (candidate / "model.safetensors").is_file():
            return candidate
        if (candidate / LATEST).is_file():
            ckpt = candidate / (candidate / LATEST).read_text().strip()
            if (ckpt / "model.safetensors").is_file():
                return ckpt
    raise FileNotFoundError(f"no checkpoint at {path} (expected model.safetensors, or a 'latest' pointer)")


def checkpoints_newest_first(ckpt_dir: str | Path) -> list[Path]:
    """The ``iter_*`` checkpoints of a run's checkpoints folder, the one ``latest`` names first."""
    ckpt_dir = Path(ckpt_dir)
    found = sorted((p for p in ckpt_dir.glob("iter_*") if p.is_dir()), reverse=True)
    latest = ckpt_dir / LATEST
    if latest.is_file():
        named = ckpt_dir / latest.read_text().strip()
        found = [named] + [p for p in found if p != named] if named.is_dir() else found
    return found


def newest_intact_checkpoint(ckpt_dir: str | Path, report=print) -> Path:
    """The newest checkpoint whose files all verify; damaged newer ones are reported (``report``) and skipped."""
    candidates = checkpoints_newest_first(ckpt_dir)
    if not candidates:
        raise FileNotFoundError(f"no checkpoint in {ckpt_dir}")
    problems = []
    for ckpt in candidates:
        try:
            verify_checkpoint(ckpt)
            for name in ("model.safetensors", "config.json", "trainer.safetensors", "trainer.json"):
                if not (ckpt / name).is_file():
                    raise CheckpointError(f"checkpoint file {ckpt / name} is missing")
        except CheckpointError as e:
            problems.append(str(e))
            continue
        if problems:
            report(f"{'; '.join(problems)}: resuming from the newest intact checkpoint, {ckpt}")
        return ckpt
    raise CheckpointError(f"no intact checkpoint in {ckpt_dir}: " + "; ".join(problems))


def refuse_lerobot_directory(ckpt: Path, saved: Any) -> None:
    """A LeRobot pretrained directory (config.json with its policy ``type``, no run config) is not an rlrobot
    checkpoint: a one-line CheckpointError saying what it is and how to start a run from it, before any weight loads."""
    if not isinstance(saved, dict) or "train" in saved or not isinstance(saved.get("type"), str):
        return
    kind = saved["type"]
    raise CheckpointError(f"{ckpt} is a LeRobot pretrained directory (policy type {kind!r}), not an rlrobot checkpoint: "
                          f"eval, serve, deploy and --init take an rlrobot run; start one from it with `rlrobot train "
                          f"--algo vla-sft --vla.path {ckpt} ...` (or --algo vla-flow-noise / vla-flow-sde) and give "
                          f"that run's directory")


RUN_COPIES = "run_copies"
"""config.json key: ``{"<section>.<field>": "<folder>"}``, run-config paths (a VLA's base directory) of which the run
keeps its own copy in ``RUN/<folder>``; reading the checkpoint points the field at that copy."""


def use_run_copies(saved: Any, ckpt: Path) -> None:
    """Point each path field the run copied (``RUN_COPIES``) at the copy in the run directory, so the run does not
    depend on where its inputs were; the copy is looked for beside the checkpoint and up to its run directory."""
    if not isinstance(saved, dict) or not isinstance(saved.get(RUN_COPIES), dict) or "train" not in saved:
        return
    for dotted, folder in saved[RUN_COPIES].items():
        section, _, field = dotted.rpartition(".")
        values = saved["train"].get(section) if section else saved["train"]
        copy = next((d / folder for d in (ckpt, ckpt.parent, ckpt.parent.parent) if (d / folder).is_dir()), None)
        if isinstance(values, dict) and copy is not None:
            values[field] = str(copy.resolve())


def load_checkpoint(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any], Path]:
    """(weights, config.json contents, checkpoint directory); a damaged file is named in a CheckpointError, and a
    LeRobot pretrained directory is refused before its weights load."""
    ckpt = resolve_checkpoint(path)
    saved = _read_json(ckpt / "config.json")
    refuse_lerobot_directory(ckpt, saved)
    verify_checkpoint(ckpt)
    use_run_copies(saved, ckpt)
    return _load_tensors(ckpt / "model.safetensors"), saved, ckpt


def load_config(path: str | Path) -> dict[str, Any]:
    """The config.json of a checkpoint (without loading its weights); a LeRobot pretrained directory is refused."""
    ckpt = resolve_checkpoint(path)
    saved = _read_json(ckpt / "config.json")
    refuse_lerobot_directory(ckpt, saved)
    use_run_copies(saved, ckpt)
    return saved


def load_trainer_state(ckpt: Path) -> dict[str, Any]:
    """The nested trainer state saved with a checkpoint (for ``--resume``)."""
    if not (ckpt / "trainer.safetensors").is_file():
        raise FileNotFoundError(f"{ckpt} holds weights only (no trainer state): it cannot be resumed")
    meta = _read_json(ckpt / "trainer.json")
    if meta.get("format", 1) != TRAINER_FORMAT:
        raise ValueError(f"{ckpt} was written by rlrobot before the algorithm registry (trainer state format "
                         f"{meta.get('format', 1)}, this version reads {TRAINER_FORMAT}): its weights still load for "
                         "eval, serve and --init, but its optimizer state cannot be resumed; start a new run")
    return join_tensors(meta["state"], _load_tensors(ckpt / "trainer.safetensors"))


def load_extra_file(ckpt: Path, file_name: str) -> dict[str, torch.Tensor] | None:
    """An extra safetensors file of a checkpoint (e.g. the replay buffer), or None when it was not saved."""
    path = Path(ckpt) / f"{file_name}.safetensors"
    return _load_tensors(path) if path.is_file() else None


# ---------------------------------------------------------------------- reading saved run configs
_RENAMED_V1 = {  # field in config.json version 1 (section, name; '' = the run config itself) -> its version-2 place
    ("ppo", "num_steps"): ("ppo", "rollout_steps"),
    ("sac", "steps_per_iteration"): ("sac", "rollout_steps"),
    ("sac", "num_critics"): ("policy", "num_critics"),
    ("sac", "critic_layer_norm"): ("policy", "critic_layer_norm"),
    ("flow", "num_steps"): ("flow", "denoising_steps"),
    ("flow_ppo", "num_steps"): ("flow_ppo", "rollout_chunks"),
    ("", "execute_steps"): ("flow", "execute_steps"),
    ("", "save_replay"): ("sac", "save_replay"),
}
_RENAMED_V2 = {  # field in config.json version 2 -> its version-3 place: each reward kind's settings in its section
    ("reward", "prm_mode"): ("reward", "prm", "mode"),
    ("reward", "prm_scale"): ("reward", "prm", "scale"),
    ("reward", "prm_done"): ("reward", "prm", "done"),
    ("reward", "srpo_scale"): ("reward", "srpo", "scale"),
    ("reward", "srpo_memory"): ("reward", "srpo", "memory"),
}
_UPGRADES = {1: _RENAMED_V1, 2: _RENAMED_V2}
"""version -> the renames that make it the next version"""


def _move(train: dict[str, Any], source: tuple[str, ...], target: tuple[str, ...]) -> None:
    """Move the value at path ``source`` of a run config to path ``target`` (sections made as needed); '' in a path is
    the run config itself."""
    *parents, name = [part for part in source if part]
    holder: Any = train
    for part in parents:
        holder = holder.get(part) if isinstance(holder, dict) else None
    if not isinstance(holder, dict) or name not in holder:
        return
    value = holder.pop(name)
    *parents, name = [part for part in target if part]
    holder = train
    for part in parents:
        holder = holder.setdefault(part, {})
    holder[name] = value


def upgrade_config(train: dict[str, Any]) -> dict[str, Any]:
    """A run config of any earlier version in today's layout: renamed fields moved (version 1: the fields the algorithm
    registry renamed or moved into sections; version 2: each reward kind's settings into its own section), the
    sections of other algorithms dropped later by ``build_dataclass``."""
    version = train.get("config_version", 1)
    if version >= CONFIG_VERSION:
        return train
    train = copy.deepcopy(train)
    for step in range(version, CONFIG_VERSION):
        for source, target in _UPGRADES[step].items():
            _move(train, source, target)
    train["config_version"] = CONFIG_VERSION
    return train


def build_dataclass(cls: type, values: dict[str, Any], strict: bool) -> Any:
    """A dataclass from JSON values: nested sections built recursively, lists back to tuples, unknown keys dropped
    (version-1 configs carry every algorithm's section) unless ``strict``."""
    kwargs: dict[str, Any] = {}
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(known))
    if unknown and strict:
        raise ValueError(f"{cls.__name__} has no field(s) {unknown}")
    for name, f in known.items():
        if name not in values:
            continue
        value = values[name]
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(default) and isinstance(value, dict):
            kwargs[name] = build_dataclass(type(default), value, strict)
        else:
            kwargs[name] = tuple(value) if isinstance(value, list) else value
    return cls(**kwargs)


def saved_train(saved: dict[str, Any]) -> dict[str, Any]:
    """The run config of a checkpoint's config.json contents, as today's JSON layout."""
    return upgrade_config(saved["train"])


def load_section(saved: dict[str, Any], name: str, cls: type) -> Any:
    """One section of a saved run config (``flow``, ``cal_ql``, ...) as ``cls``, without building the whole run
    config: what an algorithm's ``prepare`` reads from an ``--init`` checkpoint."""
    train = saved_train(saved)
    if name not in train:
        raise ValueError(f"the checkpoint's run config has no {name!r} section (algo={train.get('algo')!r})")
    return build_dataclass(cls, train[name], strict=False)
