"""The normaliser / unnormaliser statistics of a LeRobot pretrained directory, read from the processor files that
LeRobot's ``save_pretrained`` writes beside the weights (no LeRobot import needed):

* ``policy_preprocessor.json``: its ``normalizer_processor`` step (``norm_map``, ``eps``) and that step's
  ``state_file`` (safetensors, flat ``"<feature>.<stat>"`` names) give the state's normalisation;
* ``policy_postprocessor.json``: its ``unnormalizer_processor`` step gives the action's un-normalisation.

Every mode LeRobot has (MEAN_STD, MIN_MAX, QUANTILES, QUANTILE10, IDENTITY) is affine per dim, so each becomes a
``(shift, scale)`` pair: normalised = (x - shift) / scale, and back x = normalised * scale + shift, with LeRobot's
epsilon handling (MEAN_STD divides by std + eps and multiplies back by std; the range modes put eps in place of a zero
range). A directory without processor files gives no statistics (identity), as LeRobot does without them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

PREPROCESSOR, POSTPROCESSOR = "policy_preprocessor.json", "policy_postprocessor.json"
NORMALIZER, UNNORMALIZER = "normalizer_processor", "unnormalizer_processor"
RANGE_STATS = {"MIN_MAX": ("min", "max"), "QUANTILES": ("q01", "q99"), "QUANTILE10": ("q10", "q90")}
MODES = ("IDENTITY", "MEAN_STD", *RANGE_STATS)
STATE, ACTION = "observation.state", "action"


@dataclass
class Affine:
    """One feature's normalisation as LeRobot applies it: ``(x - shift) / scale`` and ``y * scale + shift``."""

    mode: str
    shift: torch.Tensor
    scale: torch.Tensor

    def normalise(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.shift.to(x)) / self.scale.to(x)

    def unnormalise(self, y: torch.Tensor) -> torch.Tensor:
        return y * self.scale.to(y) + self.shift.to(y)


def affine(mode: str, stats: dict[str, torch.Tensor], eps: float, inverse: bool, where: str) -> Affine:
    """LeRobot's ``_apply_transform`` for ``mode`` as an affine map (``inverse``: the unnormaliser's form)."""
    if mode == "MEAN_STD":
        missing = [s for s in ("mean", "std") if s not in stats]
        if missing:
            raise ValueError(f"{where}: MEAN_STD needs the statistics {missing}; it has {sorted(stats)}")
        std = stats["std"].float()
        return Affine(mode, stats["mean"].float(), std if inverse else std + eps)
    if mode in RANGE_STATS:
        lo_name, hi_name = RANGE_STATS[mode]
        missing = [s for s in (lo_name, hi_name) if s not in stats]
        if missing:
            raise ValueError(f"{where}: {mode} needs the statistics {missing}; it has {sorted(stats)}")
        lo, hi = stats[lo_name].float(), stats[hi_name].float()
        width = hi - lo
        width = torch.where(width == 0, torch.full_like(width, eps), width)
        return Affine(mode, lo + width / 2, width / 2)
    raise ValueError(f"{where}: normalisation mode {mode!r} is not one of {MODES}")


def _step(path: Path, file: str, registry_name: str) -> tuple[dict, dict[str, dict[str, torch.Tensor]]] | None:
    """(config, statistics by feature) of the pipeline's step ``registry_name``, None without the file or step."""
    pipeline = path / file
    if not pipeline.is_file():
        return None
    steps = [s for s in json.loads(pipeline.read_text()).get("steps", []) if s.get("registry_name") == registry_name]
    if not steps:
        return None
    step = steps[0]
    stats: dict[str, dict[str, torch.Tensor]] = {}
    if step.get("state_file"):
        from safetensors.torch import load_file

        state = path / step["state_file"]
        if not state.is_file():
            raise ValueError(f"{pipeline} names the statistics file {step['state_file']!r}, which is not in {path}")
        for flat, tensor in load_file(state).items():
            feature, stat = flat.rsplit(".", 1)
            stats.setdefault(feature, {})[stat] = tensor
    return step.get("config", {}), stats


def read_normalisation(path: str | Path) -> dict[str, Affine]:
    """The state's normalisation (``"observation.state"``) and the action's un-normalisation (``"action"``) of the
    LeRobot directory ``path``; features LeRobot leaves unchanged (IDENTITY, or no statistics) are absent. Refuses in
    one line what the adapter cannot apply yet: normalised images, relative actions."""
    root = Path(path)
    config_file = root / "config.json"
    if config_file.is_file() and json.loads(config_file.read_text()).get("use_relative_actions"):
        raise ValueError(f"{root}: use_relative_actions=true (pi0.5 relative actions) is not supported by rlrobot's "
                         "adapter yet; use a checkpoint with absolute actions")
    out: dict[str, Affine] = {}
    for file, name, feature, kind, inverse in ((PREPROCESSOR, NORMALIZER, STATE, "STATE", False),
                                               (POSTPROCESSOR, UNNORMALIZER, ACTION, "ACTION", True)):
        step = _step(root, file, name)
        if step is None:
            continue
        config, stats = step
        norm_map = config.get("norm_map", {})
        visual = [k for k, f in config.get("features", {}).items() if f.get("type") == "VISUAL"]
        if visual and norm_map.get("VISUAL", "IDENTITY") != "IDENTITY" and any(k in stats for k in visual):
            raise ValueError(f"{root / file}: images normalised with {norm_map['VISUAL']}; rlrobot's adapter supports "
                             "VISUAL IDENTITY only")
        mode = norm_map.get(kind, "IDENTITY")
        if mode == "IDENTITY" or feature not in stats:
            continue
        out[feature] = affine(mode, stats[feature], float(config.get("eps", 1e-8)), inverse, str(root / file))
    return out
