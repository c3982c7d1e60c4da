"""Checkpoints: safetensors weights + the JSON config that built them, written atomically.

Layout of one checkpoint directory::

    model.safetensors   policy weights (observation normaliser included)
    config.json         the run's config, the policy class, the spaces it was trained on
    trainer.safetensors optimizer(s), RNG and env state (only needed to resume)
    trainer.json        iteration, env steps, learning rate, RNG states that are not tensors
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


def _flatten_optimizer(state: dict[str, Any], prefix: str = "optim") -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors: dict[str, torch.Tensor] = {}
    meta: dict[str, Any] = {"param_groups": state["param_groups"], "state": {}}
    for pid, pstate in state["state"].items():
        meta["state"][str(pid)] = {}
        for k, v in pstate.items():
            if isinstance(v, torch.Tensor):
                tensors[f"{prefix}.{pid}.{k}"] = v.contiguous()
                meta["state"][str(pid)][k] = "tensor"
            else:
                meta["state"][str(pid)][k] = v
    return tensors, meta


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], meta: dict[str, Any], prefix: str = "optim") -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for pid, pstate in meta["state"].items():
        state[int(pid)] = {k: (tensors[f"{prefix}.{pid}.{k}"] if v == "tensor" else v) for k, v in pstate.items()}
    return {"state": state, "param_groups": meta["param_groups"]}


def save_checkpoint(
    root: str | Path,
    name: str,
    policy: torch.nn.Module,
    config: dict[str, Any],
    trainer_tensors: dict[str, torch.Tensor] | None = None,
    trainer_meta: dict[str, Any] | None = None,
    optimizer: torch.optim.Optimizer | dict[str, torch.optim.Optimizer] | None = None,
    keep: int = 3,
    extra_files: dict[str, dict[str, torch.Tensor]] | None = None,
) -> Path:
    """Write ``root/name`` atomically. ``optimizer`` is one optimizer or a dict of named ones (SAC has three);
    ``extra_files`` are more safetensors files in the same directory (``{"replay": tensors}`` -> replay.safetensors)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=root))
    try:
        save_file({k: v.detach().contiguous().cpu() for k, v in policy.state_dict().items()}, tmp / "model.safetensors")
        (tmp / "config.json").write_text(json.dumps(config, indent=2, default=_json_default))
        tensors = dict(trainer_tensors or {})
        meta = dict(trainer_meta or {})
        if isinstance(optimizer, dict):
            meta["optimizers"] = {}
            for opt_name, opt in optimizer.items():
                opt_tensors, meta["optimizers"][opt_name] = _flatten_optimizer(opt.state_dict(), f"optim.{opt_name}")
                tensors.update(opt_tensors)
        elif optimizer is not None:
            opt_tensors, opt_meta = _flatten_optimizer(optimizer.state_dict())
            tensors.update(opt_tensors)
            meta["optimizer"] = opt_meta
        for file_name, file_tensors in (extra_files or {}).items():
            save_file({k: v.detach().contiguous().cpu() for k, v in file_tensors.items()}, tmp / f"{file_name}.safetensors")
        if tensors or meta:
            save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, tmp / "trainer.safetensors")
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


def load_trainer_state(ckpt: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    if not (ckpt / "trainer.safetensors").is_file():
        raise FileNotFoundError(f"{ckpt} holds weights only (no trainer state): it cannot be resumed")
    return load_file(ckpt / "trainer.safetensors"), json.loads((ckpt / "trainer.json").read_text())


def restore_optimizer(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict[str, Any],
                      name: str | None = None) -> None:
    """Restore the single optimizer of a checkpoint, or the one saved under ``name`` in a dict of optimizers."""
    if name is None:
        optimizer.load_state_dict(_unflatten_optimizer(tensors, meta["optimizer"]))
    else:
        optimizer.load_state_dict(_unflatten_optimizer(tensors, meta["optimizers"][name], f"optim.{name}"))


def load_extra_file(ckpt: Path, file_name: str) -> dict[str, torch.Tensor] | None:
    """An extra safetensors file of a checkpoint (e.g. the replay buffer), or None when it was not saved."""
    path = Path(ckpt) / f"{file_name}.safetensors"
    return load_file(path) if path.is_file() else None
