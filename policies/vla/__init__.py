"""LeRobot VLAs behind our policy protocols: the ``vla`` policy kind (pi0, pi0.5, SmolVLA as FlowPolicy) and the
``vla-fast`` kind (pi0-FAST's action tokens). This package imports without LeRobot; building a VLA needs the ``vla``
extra (Python >= 3.12, lerobot 0.6.1) and says so when it is missing. The algorithms that train them live with the
others (``rlrobot.algorithms.vla``, ``rlrobot.algorithms.token_ppo``).

Modules: ``config`` (``--vla.*``, checks on a LeRobot pretrained directory), ``adapter`` (the shared FlowPolicy
implementation), ``pi0`` / ``pi05`` / ``smolvla`` (one adapter per VLA), ``load`` (local directory -> adapter),
``pi0_fast`` / ``fast_tokenizer`` / ``fast_kind`` (pi0-FAST), ``tiny`` (a tool that writes tiny random checkpoints
with the real structure, offline).
"""

from __future__ import annotations

from typing import Any

from rlrobot.policies.registry import PolicySpec, register_policy

from .config import VARIANTS, VLAConfig


def _build(meta: dict[str, Any], cfg: VLAConfig):
    from .load import build_vla  # lerobot itself is imported only once the checkpoint and the task's spaces agree

    return build_vla(meta, cfg)


register_policy(PolicySpec("vla", "vla", VLAConfig, _build))

from . import fast_kind  # noqa: E402, F401  (the vla-fast policy kind)

__all__ = ["VARIANTS", "VLAConfig"]
