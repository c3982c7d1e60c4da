"""Offline RL data: the frames of a LeRobotDataset as (s, a, r, s', terminal, truncated, MC return) device tensors,
and h-step windows of them for chunked actors.

Features read (LeRobot's names; ``rlrobot collect`` writes all of them):

- ``observation.state`` -> ``obs["state"]``; ``action`` (the task's normalised action space). A recording of
  ``rlrobot deploy --record`` stores the commanded joint targets in ``action`` and the policy's own (normalised)
  action in ``action.policy``: when ``action.policy`` exists it is the action. A DART collection
  (``rlrobot collect --label expert``) stores the expert's noise-free label in ``action`` and what the env ran in
  ``action.executed``: the transitions take ``action.executed`` (SFT imitates ``action``).
- ``next.reward`` (0 where absent: ``has_rewards`` is then False and the runner lets only behaviour cloning train);
  ``next.success`` (False where absent).
- Episode ends: ``next.terminated`` (an MDP end: no bootstrap) and ``next.truncated`` (a time-out: bootstrap from
  s') when stored. Datasets with only LeRobot's ``next.done`` (or none, e.g. a recording) end each episode with a
  time-out, except an episode ending done before ``max_episode_steps`` (from ``meta/rlrobot.json``), which terminated.
- s' is ``next.observation.state`` where the dataset stores it (``rlrobot collect`` does: at an episode's end it is
  the true final observation, which a time-out bootstraps from). Otherwise s' is the next frame's observation, and
  the last frame of an episode, which has no stored successor, uses its own: exact for a termination (no bootstrap),
  an approximation for a time-out, whose count the loader reports (``info["timeouts_without_next_obs"]``).

MC return: the discounted return-to-go inside the episode (``gamma`` fixed at load), Cal-QL's reference value.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

RLROBOT_META = "meta/rlrobot.json"
NEXT_STATE = "next.observation.state"
"""s' of every frame (the true final observation at an episode's end), written by ``rlrobot collect``"""


@dataclass
class TransitionChunks:
    """h-step windows starting at sampled frames (padded past the end of their episode)."""

    obs: dict[str, Tensor]  # [B, ...] at t
    actions: Tensor  # [B, h, A] a_t .. a_{t+h-1}, padded with the episode's last action
    rewards: Tensor  # [B, h], 0 where not valid
    valid: Tensor  # [B, h] bool, False after the episode ended inside the window
    next_obs: dict[str, Tensor]  # [B, ...] obs at t+h (the final frame's s' where the episode ended inside the window)
    terminals: Tensor  # [B] bool: the episode terminated inside the window
    truncations: Tensor  # [B] bool: the episode timed out inside the window
    discount_h: Tensor  # [B] gamma ** (number of valid steps): the bootstrap discount

    def __len__(self) -> int:
        return len(self.actions)


@dataclass
class Transitions:
    """Flat over all frames of all episodes (episodes contiguous, in order), tensors on one device."""

    obs: dict[str, Tensor]  # [N, ...]
    actions: Tensor  # [N, A] float32 in [-1, 1]
    rewards: Tensor  # [N] float32
    next_obs: dict[str, Tensor]  # [N, ...]
    terminals: Tensor  # [N] bool
    truncations: Tensor  # [N] bool
    mc_returns: Tensor  # [N] float32
    episode_index: Tensor  # [N] int64
    success: Tensor  # [N] bool
    gamma: float = 0.99
    episode_end: Tensor | None = None  # [N] int64: the flat index of the last frame of each frame's episode
    has_rewards: bool = True
    info: dict[str, Any] = field(default_factory=dict)  # where the data came from (path, recipe, counts)

    def __post_init__(self) -> None:
        if self.episode_end is None:
            self.episode_end = _episode_ends(self.episode_index)

    def __len__(self) -> int:
        return len(self.actions)

    @property
    def device(self) -> torch.device:
        return self.actions.device

    @property
    def num_episodes(self) -> int:
        return int(torch.unique(self.episode_index).numel()) if len(self) else 0

    def index(self, idx: Tensor) -> Transitions:
        """The frames at ``idx`` (a batch: ``episode_end`` keeps the flat indices of the full data)."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Tensor):
                out[f.name] = value[idx]
            elif isinstance(value, dict) and f.name in ("obs", "next_obs"):
                out[f.name] = {k: v[idx] for k, v in value.items()}
            else:
                out[f.name] = value
        return Transitions(**out)

    def sample(self, batch_size: int, generator: torch.Generator) -> Transitions:
        """``batch_size`` frames drawn uniformly (with replacement)."""
        idx = torch.randint(len(self), (batch_size,), generator=generator, device=self.device)
        return self.index(idx)

    def chunks_at(self, idx: Tensor, horizon: int) -> TransitionChunks:
        """The h-step windows starting at the frames ``idx``."""
        if horizon < 1:
            raise ValueError(f"horizon must be >= 1, got {horizon}")
        end = self.episode_end[idx]
        positions = idx[:, None] + torch.arange(horizon, device=self.device)[None, :]
        valid = positions <= end[:, None]
        positions = torch.minimum(positions, end[:, None])
        steps = valid.sum(1)
        last = idx + steps - 1  # the last valid frame of each window
        rewards = self.rewards[positions] * valid
        return TransitionChunks(
            obs={k: v[idx] for k, v in self.obs.items()}, actions=self.actions[positions], rewards=rewards, valid=valid,
            next_obs={k: v[last] for k, v in self.next_obs.items()}, terminals=self.terminals[last],
            truncations=self.truncations[last], discount_h=torch.pow(torch.full_like(rewards[:, 0], self.gamma), steps))

    def sample_chunks(self, batch_size: int, horizon: int, generator: torch.Generator) -> TransitionChunks:
        """``batch_size`` h-step windows starting at uniformly drawn frames."""
        idx = torch.randint(len(self), (batch_size,), generator=generator, device=self.device)
        return self.chunks_at(idx, horizon)

    def to(self, device: torch.device | str) -> Transitions:
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Tensor):
                value = value.to(device)
            elif isinstance(value, dict) and f.name in ("obs", "next_obs"):
                value = {k: v.to(device) for k, v in value.items()}
            out[f.name] = value
        return Transitions(**out)

    def with_actions(self, actions: Tensor) -> Transitions:
        return replace(self, actions=actions)

    def bootstrap_note(self) -> str:
        """What the loader could not give exactly: '' or a clause on the time-outs that bootstrap from their own obs."""
        count = self.info.get("timeouts_without_next_obs", 0)
        if not count:
            return ""
        return (f"; {count} time-out transition{'s' if count > 1 else ''} bootstrap from a copy of their last observation "
                f"(the dataset has no {NEXT_STATE!r})")

    def episode_stats(self) -> dict[str, float]:
        """What a user trains on: episodes, transitions, success rate (the episode's last frame) and mean return."""
        ends = torch.unique(self.episode_end)
        starts = torch.cat([torch.zeros(1, dtype=torch.long, device=self.device), ends[:-1] + 1])
        returns = torch.zeros(len(ends), device=self.device).index_add_(
            0, torch.searchsorted(ends, torch.arange(len(self), device=self.device)), self.rewards.float())
        return {"episodes": len(ends), "transitions": len(self),
                "success_rate": float(self.success[ends].float().mean()) if len(ends) else 0.0,
                "return_mean": float(returns.mean()) if len(ends) else 0.0,
                "episode_length": float((ends - starts + 1).float().mean()) if len(ends) else 0.0}


def _episode_ends(episode_index: Tensor) -> Tensor:
    n = len(episode_index)
    if n == 0:
        return torch.zeros(0, dtype=torch.long, device=episode_index.device)
    last = torch.ones(n, dtype=torch.bool, device=episode_index.device)
    last[:-1] = episode_index[1:] != episode_index[:-1]
    ends = torch.nonzero(last).squeeze(1)
    return ends[torch.searchsorted(ends, torch.arange(n, device=episode_index.device))]


def from_arrays(state: np.ndarray, actions: np.ndarray, rewards: np.ndarray, episode_index: np.ndarray,
                terminals: np.ndarray, truncations: np.ndarray, success: np.ndarray, gamma: float,
                device: torch.device | str = "cpu", has_rewards: bool = True, info: dict[str, Any] | None = None,
                next_state: np.ndarray | None = None) -> Transitions:
    """Transitions from per-frame arrays with episodes contiguous and in order; MC returns derived, and s' too unless
    ``next_state`` gives it (the last frame of an episode then has its true final observation)."""
    n = len(actions)
    episode_index = np.asarray(episode_index, np.int64).reshape(n)
    last = np.ones(n, bool)
    last[:-1] = episode_index[1:] != episode_index[:-1]
    state = np.asarray(state, np.float32)
    if next_state is None:
        next_state = state.copy()
        next_state[:-1][~last[:-1]] = state[1:][~last[:-1]]
    next_state = np.asarray(next_state, np.float32)
    rewards = np.asarray(rewards, np.float32).reshape(n)
    returns = np.zeros(n, np.float64)
    running = 0.0
    for i in range(n - 1, -1, -1):  # once at load; N is at most a few 1e5 frames
        running = rewards[i] + (0.0 if last[i] else gamma * running)
        returns[i] = running
    terminals = np.asarray(terminals, bool).reshape(n) & last
    truncations = (np.asarray(truncations, bool).reshape(n) | last) & ~terminals
    info = dict(info or {})
    if not info.get("stores_next_obs"):  # time-outs that bootstrap from a copy of their own last observation
        info["timeouts_without_next_obs"] = int((truncations & last).sum())

    def t(x: np.ndarray, dtype=None) -> Tensor:
        return torch.as_tensor(np.ascontiguousarray(x), dtype=dtype, device=device)

    return Transitions(obs={"state": t(state)}, actions=t(np.asarray(actions, np.float32)), rewards=t(rewards),
                       next_obs={"state": t(next_state)}, terminals=t(terminals), truncations=t(truncations),
                       mc_returns=t(returns.astype(np.float32)), episode_index=t(episode_index),
                       success=t(np.asarray(success, bool).reshape(n)), gamma=gamma, has_rewards=has_rewards,
                       info=info)


def _read_columns(root: Path, info: dict[str, Any], names: list[str]) -> dict[str, np.ndarray]:
    """The named vector features of every frame, in ``index`` order, without decoding images. Like
    ``read_recording``, frames beyond ``info.json``'s totals (an unfinished recorder save) are left out."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    paths = sorted(root.glob("data/*/*.parquet"))
    if not paths:
        return {}
    cols = [*names, "index", "episode_index", "frame_index"]
    table = pa.concat_tables([pq.read_table(p, columns=cols) for p in paths])
    order = np.argsort(table.column("index").to_numpy())
    out: dict[str, np.ndarray] = {}
    for name in cols:
        ft = info["features"][name]
        column = table.column(name)
        if ft["shape"] == [1]:
            values = column.to_numpy(zero_copy_only=False)
        else:
            values = np.asarray(column.to_pylist(), dtype=ft["dtype"]).reshape(len(column), *ft["shape"])
        out[name] = np.asarray(values, dtype=ft["dtype"])[order]
    keep = (out["episode_index"] < info.get("total_episodes", np.inf)) & (out["index"] < info.get("total_frames", np.inf))
    return {k: v[keep] for k, v in out.items()}


def scaled_budget(root: str | Path, batch_size: int, passes: int = 50, low: int = 2_000, high: int = 100_000
                  ) -> tuple[int, int]:
    """(gradient steps, frames): ``passes`` passes over a dataset's frames at ``batch_size``, within [low, high]."""
    info, _ = dataset_meta(root)
    frames = int(info.get("total_frames", 0))
    return min(high, max(low, passes * -(-frames // batch_size))), frames


def dataset_meta(root: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(info.json, rlrobot.json or {}) of a LeRobotDataset directory."""
    root = Path(root)
    info_path = root / "meta" / "info.json"
    if not info_path.is_file():
        raise FileNotFoundError(f"dataset={str(root)!r} is not a LeRobotDataset (no meta/info.json)")
    info = json.loads(info_path.read_text())
    meta_path = root / RLROBOT_META
    return info, (json.loads(meta_path.read_text()) if meta_path.is_file() else {})


def is_profile_dataset(features: dict[str, Any]) -> bool:
    """A dataset in the LeRobot SO-101 profile: its ``action`` names the six ``<motor>.pos`` (a real arm's recording
    with ``lerobot-record``, ``rlrobot collect --obs-mode lerobot``, ``rlrobot deploy --record`` of a profile policy):
    absolute joint targets in LeRobot's units, which the loaders turn into the task's joint_pos action."""
    from rlrobot.tasks.profile import STATE_NAMES

    return list(features.get("action", {}).get("names") or []) == list(STATE_NAMES)


def profile_actions(values: np.ndarray, meta: dict[str, Any], root: str | Path) -> np.ndarray:
    """LeRobot-unit joint targets -> the joint_pos action in [-1, 1] (``meta/rlrobot.json``'s ``use_degrees``, else
    degrees, LeRobot's default since 0.4.4); values no calibrated arm reports are refused."""
    from rlrobot.tasks.so101 import profile_units

    units = profile_units(bool(meta.get("use_degrees", True)))
    values = np.asarray(values, np.float64)
    low, high = units.profile_range()
    slack = np.where(np.arange(6) < 5, 15.0, 5.0)  # a reading may lie a little outside the model's range
    outside = (values < low - slack) | (values > high + slack)
    if outside.any():
        j = int(np.argmax(outside.any(0)))
        raise ValueError(f"dataset {root}: action values of {j} ({values[outside[:, j], j][0]:.1f}) lie outside the arm's "
                         f"range [{low[j]:.0f}, {high[j]:.0f}] in {units.body_mode} units (a -100..100 dataset needs "
                         f"use_degrees false in meta/rlrobot.json)")
    return units.profile_to_normalized(values).astype(np.float32)


def action_feature(features: dict[str, Any]) -> str:
    """The action a transition took: ``action.policy`` in a deploy recording (``action`` holds the commanded joint
    targets there), ``action.executed`` in a DART collection (``action`` is the expert's label there), else
    ``action``. A profile dataset's ``action`` (the commanded targets, what a real arm's dataset holds; its deploy
    recordings' ``action.policy`` is not read), or its DART collection's ``action.executed``."""
    if is_profile_dataset(features):
        return "action.executed" if "action.executed" in features else "action"
    for key in ("action.policy", "action.executed"):
        if key in features:
            return key
    return "action"


def check_dataset(root: str | Path, *, obs_shapes: dict[str, tuple], action_dim: int, task: str | None,
                  control_mode: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Refuse (one-line ValueError naming the feature) a dataset that does not fit the task; reads only metadata."""
    info, meta = dataset_meta(root)
    features = info.get("features", {})
    if info.get("total_episodes", 0) == 0 or info.get("total_frames", 0) == 0:
        raise ValueError(f"dataset {root} is empty ({info.get('total_episodes', 0)} episodes, "
                         f"{info.get('total_frames', 0)} frames)")
    if task is not None and meta.get("task") not in (None, task):
        raise ValueError(f"dataset {root} was recorded on task={meta['task']!r} (meta/rlrobot.json); this run trains "
                         f"task={task!r}")
    if control_mode is not None and meta.get("control_mode") not in (None, control_mode):
        raise ValueError(f"dataset {root} was recorded with control_mode={meta['control_mode']!r}; the task runs "
                         f"control_mode={control_mode!r} (pass --control-mode {meta['control_mode']})")
    key = action_feature(features)
    if key not in features:
        raise ValueError(f"dataset {root} has no 'action' feature; features: {sorted(features)}")
    if is_profile_dataset(features) and control_mode not in (None, "joint_pos"):
        raise ValueError(f"dataset {root} holds absolute joint targets in LeRobot's units (a profile dataset); the task runs "
                         f"control_mode={control_mode!r}: train with --control-mode joint_pos")
    if list(features[key]["shape"]) != [action_dim]:
        raise ValueError(f"dataset feature {key!r} has shape {features[key]['shape']}; task {task!r} has action shape "
                         f"[{action_dim}]")
    for obs_key, shape in obs_shapes.items():
        if obs_key != "state":
            raise ValueError(f"offline algorithms read the state observation; observation {obs_key!r} is not supported")
        if "observation.state" not in features:
            raise ValueError(f"dataset {root} has no feature 'observation.state'; it has "
                             f"{sorted(k for k in features if k.startswith('observation'))}")
        if list(features["observation.state"]["shape"]) != list(shape):
            raise ValueError(f"dataset feature 'observation.state' has shape {features['observation.state']['shape']}; "
                             f"task {task!r} observation 'state' needs {list(shape)}")
    return info, meta


def load_transitions(root: str | Path, *, obs_keys: tuple[str, ...] = ("state",), obs_shapes: dict[str, tuple],
                     action_dim: int, task: str | None, control_mode: str | None, gamma: float,
                     device: torch.device | str = "cpu", max_episodes: int = 0,
                     max_episode_steps: int | None = None) -> Transitions:
    """A LeRobotDataset as Transitions on ``device``; refuses a dataset of another task / control mode / action or
    observation shape, or an empty one, naming the feature (before reading any frame)."""
    root = Path(root)
    info, meta = check_dataset(root, obs_shapes={k: obs_shapes[k] for k in obs_keys}, action_dim=action_dim, task=task,
                               control_mode=control_mode)
    features = info["features"]
    key = action_feature(features)
    optional = [n for n in ("next.reward", "next.done", "next.terminated", "next.truncated", "next.success", NEXT_STATE)
                if n in features]
    cols = _read_columns(root, info, ["observation.state", key, *optional])
    if not cols or len(cols["index"]) == 0:
        raise ValueError(f"dataset {root} is empty (no frames in data/)")
    episode_index = cols["episode_index"].reshape(-1)
    if max_episodes:
        keep = np.isin(episode_index, np.unique(episode_index)[:max_episodes])
        cols = {k: v[keep] for k, v in cols.items()}
        episode_index = cols["episode_index"].reshape(-1)
    n = len(episode_index)
    last = np.ones(n, bool)
    last[:-1] = episode_index[1:] != episode_index[:-1]
    if "next.terminated" in cols:
        terminals = cols["next.terminated"].reshape(n).astype(bool)
    elif "next.done" in cols:
        horizon = max_episode_steps or meta.get("max_episode_steps")
        length = cols["frame_index"].reshape(n) + 1
        early = length < horizon if horizon else np.zeros(n, bool)
        terminals = cols["next.done"].reshape(n).astype(bool) & last & early
    else:
        terminals = np.zeros(n, bool)
    truncations = cols["next.truncated"].reshape(n).astype(bool) if "next.truncated" in cols else last & ~terminals
    has_rewards = "next.reward" in cols
    rewards = cols["next.reward"].reshape(n) if has_rewards else np.zeros(n, np.float32)
    success = cols["next.success"].reshape(n) if "next.success" in cols else np.zeros(n, bool)
    actions = cols[key].astype(np.float32)
    if is_profile_dataset(features):
        actions = profile_actions(actions, meta, root)
    if np.abs(actions).max() > 1.0 + 1e-4:
        raise ValueError(f"dataset feature {key!r} holds values outside [-1, 1] (max |a| {np.abs(actions).max():.3g}); "
                         "offline algorithms need the task's normalised action space")
    stores_next_obs = NEXT_STATE in cols
    return from_arrays(cols["observation.state"], actions, rewards, episode_index, terminals, truncations, success,
                       gamma, device, has_rewards=has_rewards, next_state=cols[NEXT_STATE] if stores_next_obs else None,
                       info={"path": str(root.resolve()), "action_feature": key, "recipe": meta.get("recipe"),
                             "task": meta.get("task"), "stores_next_obs": stores_next_obs})


def synthetic_transitions(episode_lengths: tuple[int, ...] = (20, 20, 20, 20), obs_dim: int = 4, action_dim: int = 2,
                          terminal_episodes: tuple[int, ...] = (), gamma: float = 0.99, seed: int = 0,
                          device: torch.device | str = "cpu", rewards: np.ndarray | None = None) -> Transitions:
    """Small hand-made data for unit tests: s' = s + 0.1 * [a, 0...] (a drifting point), a = tanh(W s) + noise,
    r = -|s'| (reward for moving toward the origin) unless ``rewards`` is given; the episodes listed in
    ``terminal_episodes`` end terminated, the others time out; the last frame of each episode succeeds iff its return
    is above the median."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(action_dim, obs_dim)) / np.sqrt(obs_dim)
    states, acts, eps = [], [], []
    for e, length in enumerate(episode_lengths):
        s = rng.normal(size=obs_dim)
        for _ in range(length):
            a = np.clip(np.tanh(w @ s) + 0.1 * rng.normal(size=action_dim), -1.0, 1.0)
            states.append(s.copy())
            acts.append(a)
            eps.append(e)
            s = s.copy()
            s[: min(action_dim, obs_dim)] += 0.1 * a[: min(action_dim, obs_dim)]
    state = np.asarray(states, np.float32)
    actions = np.asarray(acts, np.float32)
    episode_index = np.asarray(eps, np.int64)
    n = len(state)
    if rewards is None:
        nxt = state.copy()
        nxt[:, : min(action_dim, obs_dim)] += 0.1 * actions[:, : min(action_dim, obs_dim)]
        rewards = -np.linalg.norm(nxt, axis=1).astype(np.float32)
    last = np.ones(n, bool)
    last[:-1] = episode_index[1:] != episode_index[:-1]
    terminals = last & np.isin(episode_index, np.asarray(terminal_episodes, np.int64))
    totals = np.array([rewards[episode_index == e].sum() for e in range(len(episode_lengths))])
    success = last & (totals[episode_index] > np.median(totals))
    return from_arrays(state, actions, rewards, episode_index, terminals, last & ~terminals, success, gamma, device,
                       info={"path": "synthetic"})
