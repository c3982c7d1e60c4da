"""LeRobot VLAs (pi0, pi0.5, SmolVLA) behind the FlowPolicy protocol: the ``vla`` policy kind and the ``vla-sft`` /
``vla-flow-noise`` / ``vla-flow-sde`` algorithms. This package imports without LeRobot; building a VLA needs the ``vla``
extra (Python >= 3.12, lerobot 0.6.1) and says so when it is missing.

Modules: ``config`` (``--vla.*``, checks on a LeRobot pretrained directory), ``adapter`` (the shared FlowPolicy
implementation), ``pi0`` / ``pi05`` / ``smolvla`` (one adapter per VLA), ``load`` (local directory -> adapter),
``tiny`` (tiny random checkpoints for tests, offline), ``algorithms`` / ``runners`` (training).
"""

from __future__ import annotations

from typing import Any

from rlrobot.policies.registry import PolicySpec, register_policy

from .config import VARIANTS, VLAConfig


def _build(meta: dict[str, Any], cfg: VLAConfig):
    from .load import build_vla  # lerobot itself is imported only once the checkpoint and the task's spaces agree

    return build_vla(meta, cfg)


register_policy(PolicySpec("vla", "vla", VLAConfig, _build))

__all__ = ["VARIANTS", "VLAConfig"]
