"""Records deployed episodes as a LeRobotDataset: what the robot saw, what the policy asked, what was commanded.

Features per frame: ``observation.state`` (the policy's observation), ``observation.joints`` (measured joint
positions, rad), ``action`` (the joint targets actually commanded after the safety supervisor; the measured position
while holding), ``action.policy`` (the policy's raw action, zeros while holding), ``safety.held`` and
``safety.interventions`` (the supervisor's running count), ``observation.images.<camera>`` when the robot has
cameras, and any ``extra_features`` the caller declares (``rlrobot deploy --reward prm:PATH`` records the process
reward model's ``reward.progress``, ``reward.delta`` and ``reward.done`` per frame, for a real-robot RL loop).
Real-robot data then feeds the offline and fine-tuning paths in the ecosystem's format.

An episode appears all at once or not at all, for every reader (LeRobot, pyarrow, ours): the dataset writer builds
the next version of the whole dataset beside it and swaps it in with one atomic exchange (``LeRobotDatasetWriter``,
rlrobot/data/lerobot_dataset.py). A failure inside ``save_episode`` leaves the dataset and the recorder at the last
saved episode; a kill (SIGKILL, power loss) leaves the previous version, plus at most a hidden staging copy beside it
that ``repair_recording`` (run by ``read_recording``) deletes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from rlrobot.data.lerobot_dataset import LeRobotDatasetWriter, read_lerobot_dataset, recover_dataset


def repair_recording(root: str | Path) -> bool:
    """Clean up after a save that was killed (idempotent). True if something was found (a staging copy, or the
    previous version put back where the atomic exchange was not available)."""
    return recover_dataset(root)


def read_recording(root: str | Path, repair: bool = True) -> dict[str, Any]:
    """``read_lerobot_dataset`` that trusts the metadata: a killed save is cleaned up first (``repair``), and frames
    or episode rows beyond ``info.json``'s totals (which a consistent dataset never has) are left out and counted in
    ``"orphan_frames"``."""
    if repair:
        repair_recording(root)
    ds = read_lerobot_dataset(root)
    n_episodes, n_frames = ds["info"]["total_episodes"], ds["info"]["total_frames"]
    frames = ds["frames"]
    orphans = 0
    if frames:
        keep = (frames["episode_index"] < n_episodes) & (frames["index"] < n_frames)
        orphans = int((~keep).sum())
        ds["frames"] = {k: v[keep] for k, v in frames.items()}
    ds["episodes"] = [e for e in ds["episodes"] if e["episode_index"] < n_episodes]
    ds["orphan_frames"] = orphans
    return ds


class EpisodeRecorder:
    def __init__(self, root: str | Path, fps: float, state_dim: int, action_dim: int, joint_names: tuple[str, ...],
                 image_shapes: dict[str, tuple[int, int, int]] | None = None, robot_type: str = "so101_follower",
                 extra_features: dict[str, dict[str, Any]] | None = None):
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
        features.update(extra_features or {})
        self.extra_keys = list(extra_features or {})
        self.image_keys = list(image_shapes or {})
        self.action_dim = action_dim
        self.writer = LeRobotDatasetWriter(root, fps, features, robot_type=robot_type)

    def add_frame(self, reading: dict[str, Any], obs: dict[str, np.ndarray], action: np.ndarray | None,
                  command: np.ndarray | None, task: str, interventions: int, held: bool | None = None,
                  extra: dict[str, np.ndarray] | None = None) -> None:
        """One control tick; ``extra`` holds a value for each of the declared ``extra_features``."""
        held = command is None if held is None else held
        frame = {
            "observation.state": np.asarray(obs["state"], np.float32).reshape(-1),
            "observation.joints": np.asarray(reading["qpos"], np.float32),
            "action": np.asarray(reading["qpos"] if command is None else command, np.float32),
            "action.policy": np.zeros(self.action_dim, np.float32) if action is None
            else np.nan_to_num(np.asarray(action, np.float32)),
            "safety.held": np.array([held]),
            "safety.interventions": np.array([interventions], np.int64),
        }
        for cam in self.image_keys:
            frame[f"observation.images.{cam}"] = reading["images"][cam]
        for key in self.extra_keys:
            frame[key] = np.asarray((extra or {})[key])
        self.writer.add_frame(frame, task)

    def save_episode(self) -> int:
        """Write the buffered episode atomically (see the module's docstring); on failure the dataset and this
        recorder are back at the last saved episode (the failed one is dropped), and the error is raised."""
        try:
            return self.writer.save_episode()
        except BaseException:
            self.writer.discard_episode()
            raise

    def discard_episode(self) -> None:
        self.writer.discard_episode()
