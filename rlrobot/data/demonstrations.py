"""Demonstrations: the scripted experts write LeRobotDatasets (``rlrobot collect``), and SFT reads them back.

Features written per frame (LeRobot's names): ``observation.state``, ``observation.images.<camera>`` (HxWx3 uint8,
with ``--obs-mode rgb`` or ``state+rgb``), ``action`` (the action executed, in the task's normalised action space),
``next.reward``, ``next.done``, ``next.success``. ``meta/rlrobot.json`` records the task, control mode and spaces
the data was made with, so that a dataset that does not fit a task is refused with a clear message before training.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console

from rlrobot.data.lerobot_dataset import LeRobotDatasetWriter, read_lerobot_dataset

console = Console()
RLROBOT_META = "meta/rlrobot.json"


def image_feature(obs_key: str) -> str:
    """Env observation ``image_front`` <-> dataset feature ``observation.images.front``."""
    return "observation.images." + obs_key.removeprefix("image_")


def obs_feature(obs_key: str) -> str:
    return "observation.state" if obs_key == "state" else image_feature(obs_key)


@dataclass
class CollectArgs:
    task: str
    """native task id with a scripted expert: so101-reach | so101-push | so101-lift"""
    episodes: int
    """episodes to write (successful ones only with --success-only)"""
    out: str
    """dataset directory (must not exist or be empty)"""
    noise: float = 0.0
    """std of Gaussian noise added to the expert's actions (in the normalised action space) before execution"""
    success_only: bool = False
    """keep only episodes that end in success"""
    obs_mode: str = "state"
    control_mode: str = "ee_delta"
    num_envs: int = 8
    seed: int = 0
    image_size: int = 64
    max_attempts: int = 0
    """give up after this many episodes (0 = 20 x episodes)"""


def collect_demonstrations(args: CollectArgs) -> dict[str, Any]:
    import rlrobot
    from rlrobot.envs.registry import native_task_ids
    from rlrobot.tasks.mujoco_vec_env import OBS_MODES
    from rlrobot.tasks.so101 import CONTROL_MODES

    if args.task not in native_task_ids():
        raise ValueError(f"task={args.task!r}: scripted experts exist for the native tasks {native_task_ids()}")
    if args.obs_mode not in OBS_MODES:
        raise ValueError(f"obs_mode={args.obs_mode!r} is not one of {OBS_MODES}")
    if args.control_mode not in CONTROL_MODES:
        raise ValueError(f"control_mode={args.control_mode!r} is not one of {CONTROL_MODES}")
    if args.episodes < 1 or args.num_envs < 1:
        raise ValueError(f"episodes and num_envs must be >= 1, got {args.episodes} and {args.num_envs}")
    if args.noise < 0:
        raise ValueError(f"noise must be >= 0, got {args.noise}")
    env = rlrobot.make(args.task, args.num_envs, seed=args.seed, obs_mode=args.obs_mode,
                       control_mode=args.control_mode, image_size=args.image_size)
    try:
        return _collect(env, args)
    finally:
        env.close()


def _collect(env, args: CollectArgs) -> dict[str, Any]:
    obs_space = env.single_observation_space
    action_dim = int(env.single_action_space.shape[0])
    features: dict[str, dict[str, Any]] = {}
    for key, space in obs_space.spaces.items():
        if key == "state":
            features["observation.state"] = {"dtype": "float32", "shape": list(space.shape), "names": None}
        else:
            c, h, w = space.shape
            features[image_feature(key)] = {"dtype": "image", "shape": [h, w, c], "names": ["height", "width", "channels"]}
    features["action"] = {"dtype": "float32", "shape": [action_dim], "names": None}
    features["next.reward"] = {"dtype": "float32", "shape": [1], "names": None}
    features["next.done"] = {"dtype": "bool", "shape": [1], "names": None}
    features["next.success"] = {"dtype": "bool", "shape": [1], "names": None}
    fps = 1.0 / float(env.control_dt)
    writer = LeRobotDatasetWriter(args.out, fps=round(fps, 6), features=features, robot_type="so101_follower")
    instruction = env.instruction[0]
    gen = torch.Generator().manual_seed(args.seed)
    buffers: list[list[dict[str, Any]]] = [[] for _ in range(env.num_envs)]
    attempted, kept = 0, 0
    outcomes: list[bool] = []
    max_attempts = args.max_attempts or 20 * args.episodes
    obs, _ = env.reset(seed=args.seed)
    while kept < args.episodes:
        if attempted >= max_attempts:
            raise ValueError(f"only {kept} of {args.episodes} episodes kept after {attempted} attempts "
                               f"(success_only={args.success_only}, noise={args.noise}): lower --noise")
        action = env.expert_action()
        if args.noise > 0:
            action = (action + args.noise * torch.randn(action.shape, generator=gen)).clamp(-1.0, 1.0)
        next_obs, reward, terminated, truncated, info = env.step(action)
        done = (terminated | truncated).numpy()
        host = {k: v.numpy() for k, v in obs.items()}
        for i in range(env.num_envs):
            frame: dict[str, Any] = {"action": action[i].numpy().astype(np.float32),
                                     "next.reward": np.array([reward[i].item()], np.float32),
                                     "next.done": np.array([bool(done[i])]),
                                     "next.success": np.array([bool(info["success"][i])])}
            for key, value in host.items():
                frame[obs_feature(key)] = value[i] if key == "state" else value[i].transpose(1, 2, 0)
            buffers[i].append(frame)
        if "episode" in info:
            for env_id, success in zip(info["episode"]["env_ids"].tolist(), info["episode"]["success"].tolist(),
                                       strict=True):
                attempted += 1
                outcomes.append(bool(success))
                frames, buffers[env_id] = buffers[env_id], []
                if kept >= args.episodes or (args.success_only and not success):
                    continue
                for f in frames:
                    writer.add_frame(f, instruction)
                writer.save_episode()
                kept += 1
        obs = next_obs
    meta = {"task": args.task, "control_mode": args.control_mode, "obs_mode": args.obs_mode,
            "action_dim": action_dim, "observation_space": {k: list(v.shape) for k, v in obs_space.spaces.items()},
            "max_episode_steps": env.max_episode_steps, "control_dt": float(env.control_dt), "expert_noise": args.noise,
            "success_only": args.success_only, "episodes_attempted": attempted,
            "expert_success_rate": float(np.mean(outcomes)), "seed": args.seed}
    (Path(args.out) / RLROBOT_META).write_text(json.dumps(meta, indent=2))
    summary = {"out": args.out, "episodes": kept, "frames": writer.total_frames, **meta}
    console.print(f"wrote {kept} episodes ({writer.total_frames} frames) to {args.out}; expert success "
                  f"{meta['expert_success_rate']:.2f} over {attempted} attempted episodes")
    return summary


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
                        max_episodes: int = 0) -> Demonstrations:
    """Read a LeRobotDataset for SFT, checking that its features match the task's spaces (clear errors otherwise)."""
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
    if list(features["action"]["shape"]) != [action_dim]:
        raise ValueError(f"dataset feature 'action' has shape {features['action']['shape']}; task {task!r} has "
                         f"action shape [{action_dim}]")
    for key in obs_keys:
        name = obs_feature(key)
        if name not in features:
            raise ValueError(f"dataset {root} has no feature {name!r} (needed for observation {key!r}); it has "
                             f"{sorted(k for k in features if k.startswith('observation'))}")
        shape = tuple(features[name]["shape"])
        expected = tuple(obs_space[key])
        if key != "state":
            expected = (expected[1], expected[2], expected[0])  # stored HxWxC
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
    for key in obs_keys:
        values = frames[obs_feature(key)][keep]
        if key == "state":
            obs[key] = torch.as_tensor(values.astype(np.float32))
        else:
            obs[key] = torch.as_tensor(np.ascontiguousarray(values.transpose(0, 3, 1, 2)))
    return Demonstrations(obs=obs, chunks=torch.as_tensor(actions[positions]), mask=torch.as_tensor(mask),
                          num_episodes=len(episodes))
