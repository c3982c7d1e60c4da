"""Checkpoints: safetensors weights + the JSON config that built them, written atomically.

Layout of one checkpoint directory::

    model.safetensors   policy weights (observation normaliser included)
    config.json         the run's config, the policy class, the spaces it was trained on
    trainer.safetensors the tensors of the trainer state (algorithm optimizers, RNG, env state: only needed to resume)
    trainer.json        the rest of the trainer state (counters, learning rate, ...) with references to those tensors
    replay.safetensors  (off-policy runs with --save-replay) the replay buffer, so a resume starts warm

A directory is complete or absent: it is written under a temporary name and renamed, then ``latest`` (a text
file) is replaced atomically to point at it.
"""

from __future__ import annotations

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


def load_checkpoint(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any], Path]:
    ckpt = resolve_checkpoint(path)
    return load_file(ckpt / "model.safetensors"), json.loads((ckpt / "config.json").read_text()), ckpt


def load_config(path: str | Path) -> dict[str, Any]:
    """The config.json of a checkpoint (without loading its weights)."""
    return json.loads((resolve_checkpoint(path) / "config.json").read_text())


def load_trainer_state(ckpt: Path) -> dict[str, Any]:
    """The nested trainer state saved with a checkpoint (for ``--resume``)."""
    if not (ckpt / "trainer.safetensors").is_file():
        raise FileNotFoundError(f"{ckpt} holds weights only (no trainer state): it cannot be resumed")
    meta = json.loads((ckpt / "trainer.json").read_text())
    if meta.get("format", 1) != TRAINER_FORMAT:
        raise ValueError(f"{ckpt} was written by rlrobot before the algorithm registry (trainer state format "
                         f"{meta.get('format', 1)}, this version reads {TRAINER_FORMAT}): its weights still load for "
                         "eval, serve and --init, but its optimizer state cannot be resumed; start a new run")
    return join_tensors(meta["state"], load_file(ckpt / "trainer.safetensors"))


def load_extra_file(ckpt: Path, file_name: str) -> dict[str, torch.Tensor] | None:
    """An extra safetensors file of a checkpoint (e.g. the replay buffer), or None when it was not saved."""
    path = Path(ckpt) / f"{file_name}.safetensors"
    return load_file(path) if path.is_file() else None
