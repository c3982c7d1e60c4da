"""Records deployed episodes as a LeRobotDataset: what the robot saw, what the policy asked, what was commanded.

Features per frame: ``observation.state`` (the policy's observation), ``observation.joints`` (measured joint
positions, rad), ``action`` (the joint targets actually commanded after the safety supervisor; the measured position
while holding), ``action.policy`` (the policy's raw action, zeros while holding), ``safety.held`` and
``safety.interventions`` (the supervisor's running count), and ``observation.images.<camera>`` when the robot has
cameras. Real-robot data then feeds the offline and fine-tuning paths in the ecosystem's format.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from rlrobot.data.lerobot_dataset import LeRobotDatasetWriter


class EpisodeRecorder:
    def __init__(self, root: str | Path, fps: float, state_dim: int, action_dim: int, joint_names: tuple[str, ...],
                 image_shapes: dict[str, tuple[int, int, int]] | None = None, robot_type: str = "so101_follower"):
        features: dict[str, dict[str, Any]] = {
            "observation.state": {"dtype": "float32", "shape": [state_dim], "names": None},
            "observation.joints": {"dtype": "float32", "shape": [len(joint_names)], "names": list(joint_names)},
            "action": {"dtype": "float32", "shape": [len(joint_names)], "names": list(joint_names)},
            "action.policy": {"dtype": "float32", "shape": [action_dim], "names": None},
            "safety.held": {"dtype": "bool", "shape": [1], "names": None},
            "safety.interventions": {"dtype": "int64", "shape": [1], "names": None},
        }
        for cam, shape in (image_shapes or {}).items():
            features[f"observation.images.{cam}"] = {"dtype": "image", "shape": list(shape),
                                                     "names": ["height", "width", "channels"]}
        self.image_keys = list(image_shapes or {})
        self.action_dim = action_dim
        self.writer = LeRobotDatasetWriter(root, fps, features, robot_type=robot_type)

    def add_frame(self, reading: dict[str, Any], obs: dict[str, np.ndarray], action: np.ndarray | None,
                  command: np.ndarray | None, task: str, interventions: int) -> None:
        held = command is None
        frame = {
            "observation.state": np.asarray(obs["state"], np.float32).reshape(-1),
            "observation.joints": np.asarray(reading["qpos"], np.float32),
            "action": np.asarray(reading["qpos"] if held else command, np.float32),
            "action.policy": np.zeros(self.action_dim, np.float32) if action is None
            else np.nan_to_num(np.asarray(action, np.float32)),
            "safety.held": np.array([held]),
            "safety.interventions": np.array([interventions], np.int64),
        }
        for cam in self.image_keys:
            frame[f"observation.images.{cam}"] = reading["images"][cam]
        self.writer.add_frame(frame, task)

    def save_episode(self) -> int:
        return self.writer.save_episode()
