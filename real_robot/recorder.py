"""Records deployed episodes as a LeRobotDataset: what the robot saw, what the policy asked, what was commanded.

Features per frame: ``observation.state`` (the policy's observation), ``observation.joints`` (measured joint
positions, rad), ``action`` (the joint targets actually commanded after the safety supervisor; the measured position
while holding), ``action.policy`` (the policy's raw action, zeros while holding), ``safety.held`` and
``safety.interventions`` (the supervisor's running count), ``observation.images.<camera>`` when the robot has
cameras, and any ``extra_features`` the caller declares (``rlrobot deploy --reward prm:PATH`` records the process
reward model's ``reward.progress``, ``reward.delta`` and ``reward.done`` per frame, for a real-robot RL loop).
Real-robot data then feeds the offline and fine-tuning paths in the ecosystem's format.

An episode appears all at once or not at all. ``save_episode`` first writes an undo journal (``meta/.journal/``:
copies of the metadata files as they were, and ``pending.json`` naming the episode's data file); the writer then adds
the data file and rewrites the metadata; removing ``pending.json`` commits. If anything fails in between, the
recorder rolls the dataset back to the last committed episode at once; if the process dies (SIGKILL, power loss),
``repair_recording`` (run by ``read_recording``) rolls it back from the journal. ``read_recording`` also trusts the
metadata (``info.json``'s totals) and ignores any frames beyond them.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from rlrobot.data.lerobot_dataset import CHUNK_SIZE, DATA_PATH, EPISODES_PATH, LeRobotDatasetWriter, read_lerobot_dataset

JOURNAL_DIR = "meta/.journal"
META_FILES = ("meta/info.json", "meta/stats.json", "meta/tasks.parquet", EPISODES_PATH)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _begin(root: Path, data_file: str) -> None:
    """Open a transaction: the committed metadata is copied aside, then ``pending.json`` marks it open."""
    journal = root / JOURNAL_DIR
    shutil.rmtree(journal, ignore_errors=True)
    journal.mkdir(parents=True)
    existed = []
    for i, name in enumerate(META_FILES):
        if (root / name).is_file():
            shutil.copyfile(root / name, journal / f"{i}.bak")
            existed.append(name)
    tmp = journal / ".pending.json.tmp"
    tmp.write_text(json.dumps({"data_file": data_file, "existed": existed}))
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, journal / "pending.json")
    _fsync_dir(journal)


def _commit(root: Path) -> None:
    journal = root / JOURNAL_DIR
    (journal / "pending.json").unlink()  # the commit point
    _fsync_dir(journal)
    shutil.rmtree(journal, ignore_errors=True)


def repair_recording(root: str | Path) -> bool:
    """Roll back an episode whose save did not commit (idempotent: safe to run again after a crash while repairing).
    Returns True if something was rolled back."""
    root = Path(root)
    journal = root / JOURNAL_DIR
    pending = journal / "pending.json"
    if not pending.is_file():
        shutil.rmtree(journal, ignore_errors=True)  # a committed transaction's leftovers
        return False
    plan = json.loads(pending.read_text())
    for path in (root / plan["data_file"], (root / plan["data_file"]).with_name(f".{Path(plan['data_file']).name}.tmp")):
        path.unlink(missing_ok=True)
    for i, name in enumerate(META_FILES):
        backup = journal / f"{i}.bak"
        if backup.is_file():
            os.replace(backup, root / name)
        elif name not in plan["existed"]:
            (root / name).unlink(missing_ok=True)
    pending.unlink()
    shutil.rmtree(journal, ignore_errors=True)
    return True


def read_recording(root: str | Path, repair: bool = True) -> dict[str, Any]:
    """``read_lerobot_dataset`` that trusts the metadata: an unfinished save is rolled back first (``repair``), and
    frames or episode rows beyond ``info.json``'s totals (orphans) are left out and counted in ``"orphan_frames"``."""
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
        recorder are back at the last committed episode, and the error is raised."""
        w = self.writer
        chunk_index, file_index = divmod(len(w.episodes), CHUNK_SIZE)
        data_file = DATA_PATH.format(chunk_index=chunk_index, file_index=file_index)
        state = (copy.deepcopy(w.episodes), copy.deepcopy(w.stats), dict(w.tasks), w.total_frames)
        _begin(w.root, data_file)
        try:
            index = w.save_episode()
        except BaseException:
            repair_recording(w.root)
            w.episodes, w.stats, w.tasks, w.total_frames = state
            w.discard_episode()
            raise
        _commit(w.root)
        return index

    def discard_episode(self) -> None:
        self.writer.discard_episode()
