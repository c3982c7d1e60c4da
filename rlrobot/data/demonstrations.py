"""Demonstrations: the LeRobotDataset layout ``rlrobot collect`` writes (``rlrobot.commands.collect``) and SFT reads.

Features written per frame (LeRobot's names): ``observation.state``, ``observation.images.<camera>`` (HxWx3 uint8,
with ``--obs-mode rgb`` or ``state+rgb``), ``action`` (the action executed, in the task's normalised action space),
``next.reward``, ``next.done``, ``next.success``. ``meta/rlrobot.json`` records the task, control mode and spaces
the data was made with, so that a dataset that does not fit a task is refused with a clear message before training.

A dataset of the LeRobot SO-101 profile (a real arm's ``lerobot-record`` dataset, ``rlrobot collect --obs-mode
lerobot``, a profile ``rlrobot deploy --record``) loads alike: its ``action`` (absolute joint targets in LeRobot's
units) becomes the task's joint_pos action, and camera frames of another size than the task's go through the
profile's ``prepare_frames`` (the crop of ``image_crops``, default the centred square, then the resize).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from rich.console import Console

from rlrobot.data.lerobot_dataset import read_lerobot_dataset
from rlrobot.tasks.registry import is_adapter_task

console = Console(soft_wrap=True)  # long lines stay one line in logs (CI, nohup), not wrapped at 80 columns
RLROBOT_META = "meta/rlrobot.json"
# observations made from the instruction (tasks/so101_suite.py): a dataset stores the instruction as each frame's
# task string, as LeRobot does, and the loader re-encodes it with the task's own vocabulary and embedding table
INSTRUCTION_KEYS = ("instruction_tokens", "instruction_embedding")


def image_feature(obs_key: str) -> str:
    """Env observation ``image_front`` <-> dataset feature ``observation.images.front``."""
    return "observation.images." + obs_key.removeprefix("image_")


def obs_feature(obs_key: str) -> str:
    return "observation.state" if obs_key == "state" else image_feature(obs_key)


@dataclass
class Demonstrations:
    """Frames of a dataset as tensors, with the action chunk that starts at each frame."""

    obs: dict[str, torch.Tensor]  # env observation keys -> [N, ...] (images [N, 3, H, W] uint8)
    chunks: torch.Tensor  # [N, H, A] actions a_i .. a_{i+H-1}, padded with the episode's last action
    mask: torch.Tensor  # [N, H] False where the chunk runs past the end of its episode
    num_episodes: int

    def __len__(self) -> int:
        return len(self.chunks)


def load_demonstrations(root: str | Path, obs_space: dict[str, tuple[int, ...]], action_dim: int, chunk_size: int,
                        obs_keys: tuple[str, ...], control_mode: str | None = None, task: str | None = None,
                        max_episodes: int = 0, image_crops: dict[str, tuple[float, float, float, float]] | None = None
                        ) -> Demonstrations:
    """Read a LeRobotDataset for SFT, checking that its features match the task's spaces (clear errors otherwise).
    ``image_crops``: {camera: crop fractions} of frames stored at another size (the setup's crops)."""
    from rlrobot.data.transitions import is_profile_dataset, profile_actions

    root = Path(root)
    data = read_lerobot_dataset(root)
    features = data["info"]["features"]
    meta_path = root / RLROBOT_META
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    if control_mode is not None and meta.get("control_mode") not in (None, control_mode):
        raise ValueError(f"dataset {root} was recorded with control_mode={meta['control_mode']!r}; the task runs "
                         f"control_mode={control_mode!r} (pass --control-mode {meta['control_mode']})")
    if "action" not in features:
        raise ValueError(f"dataset {root} has no 'action' feature; features: {sorted(features)}")
    profile = is_profile_dataset(features)
    if profile and control_mode not in (None, "joint_pos"):
        raise ValueError(f"dataset {root} holds absolute joint targets in LeRobot's units (a profile dataset); the task runs "
                         f"control_mode={control_mode!r}: train with --control-mode joint_pos")
    if list(features["action"]["shape"]) != [action_dim]:
        raise ValueError(f"dataset feature 'action' has shape {features['action']['shape']}; task {task!r} has "
                         f"action shape [{action_dim}]")
    for key in obs_keys:
        if key in INSTRUCTION_KEYS:
            continue
        name = obs_feature(key)
        if name not in features:
            raise ValueError(f"dataset {root} has no feature {name!r} (needed for observation {key!r}); it has "
                             f"{sorted(k for k in features if k.startswith('observation'))}")
        shape = tuple(features[name]["shape"])
        expected = tuple(obs_space[key])
        if key != "state":
            expected = (expected[1], expected[2], expected[0])  # stored HxWxC
            if profile and len(shape) == 3 and shape[2] == 3 and expected[0] == expected[1]:
                continue  # a camera's frames at its own size: prepare_frames makes them the task's
        if shape != expected:
            raise ValueError(f"dataset feature {name!r} has shape {list(shape)}; task {task!r} observation {key!r} "
                             f"needs {list(expected)}")
    frames = data["frames"]
    episode_index = frames["episode_index"].reshape(-1)
    episodes = np.unique(episode_index)
    if max_episodes:
        episodes = episodes[:max_episodes]
    keep = np.isin(episode_index, episodes)
    episode_index = episode_index[keep]
    actions = frames["action"][keep].astype(np.float32)
    if profile:
        actions = profile_actions(actions, meta, root)
    # chunk targets: for each frame i, actions i .. i+H-1 of its own episode (padded and masked past the end)
    n = len(actions)
    starts = np.zeros(n, np.int64)
    ends = np.zeros(n, np.int64)
    for e in episodes:
        idx = np.nonzero(episode_index == e)[0]
        starts[idx], ends[idx] = idx[0], idx[-1]
    offsets = np.arange(chunk_size)[None, :]
    positions = np.arange(n)[:, None] + offsets
    mask = positions <= ends[:, None]
    positions = np.minimum(positions, ends[:, None])
    lengths = ends - starts + 1
    if chunk_size > lengths.max():
        raise ValueError(f"flow.chunk_size={chunk_size} is larger than the longest episode of {root} "
                         f"({int(lengths.max())} frames)")
    obs: dict[str, torch.Tensor] = {}
    language = [k for k in obs_keys if k in INSTRUCTION_KEYS]
    if language:
        obs.update(_instruction_obs(data, keep, language, task))
    for key in obs_keys:
        if key in INSTRUCTION_KEYS:
            continue
        values = frames[obs_feature(key)][keep]
        if key == "state":
            obs[key] = torch.as_tensor(values.astype(np.float32))
        else:
            size = obs_space[key][-1]
            if values.shape[1:3] != (size, size):  # a camera's own frames: the profile's one preprocessing
                from rlrobot.tasks.profile import prepare_frames

                crop = (image_crops or {}).get(key.removeprefix("image_"))
                values = prepare_frames(values, crop, size)
            obs[key] = torch.as_tensor(np.ascontiguousarray(values.transpose(0, 3, 1, 2)))
    return Demonstrations(obs=obs, chunks=torch.as_tensor(actions[positions]), mask=torch.as_tensor(mask),
                          num_episodes=len(episodes))


def _instruction_obs(data: dict, keep: np.ndarray, keys: list[str], task: str | None) -> dict[str, torch.Tensor]:
    """Token ids / embeddings of every kept frame's task string, from the task's ``instruction_observation``."""
    from rlrobot.tasks.registry import task_spec

    entry = task_spec(task).entry_point if task is not None and not is_adapter_task(task) else None
    if not hasattr(entry, "instruction_observation"):
        raise ValueError(f"observations {keys} are made from instructions; task {task!r} has no instruction encoding")
    names = {i: t for t, i in data["tasks"].items()}
    index = data["frames"]["task_index"].reshape(-1)[keep]
    unique, inverse = np.unique(index, return_inverse=True)
    encoded = entry.instruction_observation([names[int(i)] for i in unique])
    return {k: torch.as_tensor(encoded[k][inverse]) for k in keys}
