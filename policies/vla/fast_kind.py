"""The ``vla-fast`` policy kind: a LeRobot pi0-FAST directory (``--vla-fast.path DIR``, as written by
``build_tiny_pi0_fast``: LeRobot's save_pretrained + our fitted FAST tokenizer) that checkpoints, evaluation and
``rlrobot serve`` rebuild; ``--algo vla-token-ppo`` (``rlrobot.algorithms.token_ppo``) trains it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlrobot.domains import PositiveInt
from rlrobot.policies.registry import PolicySpec, register_policy
from rlrobot.sections import Section


@dataclass
class VLAFastConfig(Section):
    path: str = ""
    """a pi0-FAST directory on local disk (LeRobot's save_pretrained + tokenizer/ + fast_tokenizer/); never a hub id"""
    value_hidden: PositiveInt = 64
    """width of the value head on the VLM's prefix output"""
    detach_value: bool = True
    """the critic's gradient does not reach the VLM"""

    def observation_keys(self, run) -> tuple[str, ...]:
        return ("state",)

    def validate(self, run=None) -> None:
        if not self.path:
            raise ValueError("vla_fast.path is empty: pass --vla-fast.path DIR, a pi0-FAST directory on local disk")
        if run is not None and run.obs_mode not in ("state", "state+rgb"):
            raise ValueError(f"obs_mode={run.obs_mode!r}: the pi0-FAST policy reads the 'state' observation")

    def chunk_size(self) -> int:
        config = Path(self.path) / "config.json"
        if not config.is_file():
            raise ValueError(f"vla_fast.path={self.path!r} has no config.json: not a LeRobot pretrained directory")
        meta = json.loads(config.read_text())
        if meta.get("type") != "pi0_fast":
            raise ValueError(f"vla_fast.path={self.path!r} holds a {meta.get('type')!r} policy, not pi0_fast")
        return int(meta["chunk_size"])


def _build(meta: dict[str, Any], cfg: VLAFastConfig):
    from .pi0_fast import load_pi0_fast

    policy = load_pi0_fast(cfg.path, value_hidden=cfg.value_hidden, detach_value=cfg.detach_value)
    if meta.get("obs_dim") is not None and policy.state_dim != meta["obs_dim"]:
        raise ValueError(f"observation.state of {cfg.path} has {policy.state_dim} dims; the task's state has {meta['obs_dim']}")
    if policy.action_dim != meta["action_dim"]:
        raise ValueError(f"action of {cfg.path} has {policy.action_dim} dims; the task's action space has {meta['action_dim']}")
    return policy


register_policy(PolicySpec("vla-fast", "vla_fast", VLAFastConfig, _build))
