"""Checkpoints of LeRobot-profile policies (untrained weights) for the deploy tests: what their actors read is what
the tests are about, not how well they act."""

from __future__ import annotations

from pathlib import Path

import rlrobot
from rlrobot.checkpoints import save_checkpoint
from rlrobot.config import train_config
from rlrobot.policies.flow import FlowPolicyConfig
from rlrobot.policies.registry import build_policy, policy_metadata


def profile_checkpoint(root: Path, obs_keys: tuple[str, ...], task: str = "so101-lift", control_mode: str = "joint_pos",
                       obs_mode: str = "lerobot", setup: str = "") -> Path:
    """A small flow policy trained (zero steps) on ``task`` in ``obs_mode`` (with ``setup``, inline JSON) whose actor
    reads ``obs_keys``."""
    cfg = train_config("sft", task=task, obs_mode=obs_mode, control_mode=control_mode, logger="none", setup=setup,
                       flow=FlowPolicyConfig(obs_keys=obs_keys, chunk_size=4, execute_steps=4, denoising_steps=2,
                                             embed_dim=32, state_hidden=(32, 32), velocity_hidden=(64, 64),
                                             image_channels=(8, 8)))
    env = rlrobot.make(task, 1, obs_mode=obs_mode, control_mode=control_mode, **({"setup": setup} if setup else {}))
    meta = policy_metadata(cfg, env)
    env.close()
    policy = build_policy(meta, cfg)
    return save_checkpoint(root / "checkpoints", "iter_000001", policy, {"train": cfg.to_dict(), **meta})
