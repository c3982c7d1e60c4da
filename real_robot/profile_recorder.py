"""Records deployed episodes of a LeRobot-profile policy in the profile's own dataset layout, which a dataset
``lerobot-record`` writes on a real SO-101 also has: ``observation.state`` (the six ``<motor>.pos`` readings,
LeRobot's units and names), ``observation.images.<camera>`` (the frames the policy saw, after ``prepare_frames``),
``action`` (the joint targets commanded after the safety supervisor, in the same units and names; the reading while
holding). Beside them: ``action.policy`` (the policy's raw action, zeros while holding), ``safety.held`` and
``safety.interventions``, and any ``extra_features`` (the PRM's progress with ``rlrobot deploy --reward``). Every
loader that reads a real arm's dataset reads this one (``rlrobot.data``: SFT, offline RL, PRM), and LeRobot's
``LeRobotDataset`` opens it. Writes are atomic per episode (``LeRobotDatasetWriter``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from rlrobot.data.lerobot_dataset import LeRobotDatasetWriter
from rlrobot.tasks.profile import IMAGE_PREFIX, STATE_NAMES


def profile_features(image_size: int, cameras: list[str]) -> dict[str, dict[str, Any]]:
    """The LeRobot features of the profile: state, one image per camera, action (what lerobot-record writes)."""
    features: dict[str, dict[str, Any]] = {
        "observation.state": {"dtype": "float32", "shape": [len(STATE_NAMES)], "names": list(STATE_NAMES)},
    }
    for cam in cameras:
        features[f"observation.images.{cam}"] = {"dtype": "image", "shape": [image_size, image_size, 3],
                                                 "names": ["height", "width", "channels"]}
    features["action"] = {"dtype": "float32", "shape": [len(STATE_NAMES)], "names": list(STATE_NAMES)}
    return features


class ProfileRecorder:
    """``add_frame`` per control tick, ``save_episode`` / ``discard_episode`` per episode (the executor's recorder)."""

    def __init__(self, root: str | Path, fps: float, units, image_size: int, cameras: list[str], action_dim: int,
                 extra_features: dict[str, dict[str, Any]] | None = None):
        features = profile_features(image_size, cameras)
        features.update({
            "action.policy": {"dtype": "float32", "shape": [action_dim], "names": None},
            "safety.held": {"dtype": "bool", "shape": [1], "names": None},
            "safety.interventions": {"dtype": "int64", "shape": [1], "names": None},
        })
        features.update(extra_features or {})
        self.units, self.cameras, self.action_dim = units, list(cameras), action_dim
        self.extra_keys = list(extra_features or {})
        self.writer = LeRobotDatasetWriter(root, fps, features, robot_type="so101_follower")

    def add_frame(self, reading: dict[str, Any], obs: dict[str, np.ndarray], action: np.ndarray | None,
                  command: np.ndarray | None, task: str, interventions: int, held: bool | None = None,
                  extra: dict[str, np.ndarray] | None = None) -> None:
        held = command is None if held is None else held
        commanded = np.asarray(reading["qpos"] if command is None else command, np.float64)
        frame = {
            "observation.state": np.asarray(obs["state"], np.float32).reshape(-1),
            "action": self.units.to_profile(commanded).astype(np.float32),
            "action.policy": np.zeros(self.action_dim, np.float32) if action is None
            else np.nan_to_num(np.asarray(action, np.float32)).reshape(-1),
            "safety.held": np.array([held]),
            "safety.interventions": np.array([interventions], np.int64),
        }
        for cam in self.cameras:
            frame[f"observation.images.{cam}"] = np.asarray(obs[IMAGE_PREFIX + cam]).reshape(3, *obs[IMAGE_PREFIX + cam].shape[-2:]
                                                                                              ).transpose(1, 2, 0)
        for key in self.extra_keys:
            frame[key] = np.asarray((extra or {})[key])
        self.writer.add_frame(frame, task)

    def save_episode(self) -> int:
        try:
            return self.writer.save_episode()
        except BaseException:
            self.writer.discard_episode()
            raise

    def discard_episode(self) -> None:
        self.writer.discard_episode()
