"""Isaac Lab tasks (``isaaclab:Isaac-Lift-Cube-Franka-v0``, ...) as a VecEnv: manager-based and direct RL envs.

Isaac Lab's ``step`` returns ``(obs_groups, reward, terminated, time_outs, extras)`` after resetting finished envs
inside the step (same-step autoreset, like our contract), but it returns no final observation: the observation of
a finished env is already the next episode's. The adapter recovers the true final observation by computing the
observations once more right before Isaac Lab's ``_reset_idx`` runs (only on steps where some env resets), so a
time-out is bootstrapped from the right state (the bug RSL-RL's issue #151 describes).

The mapping itself (observation groups -> our keys, final observations, success from termination terms, action
scaling) is pure functions below, unit-tested on tensors shaped like Isaac Lab's; the live env needs Isaac Sim
(an NVIDIA GPU and NVIDIA's package index) and is imported lazily.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium
import numpy as np
import torch

from rlrobot.envs.vec_env import Obs, check_action, episode_info


# ---------------------------------------------------------------------- pure mapping (tested without Isaac Lab)
def map_observations(groups: Mapping[str, Any], state_group: str = "policy") -> Obs:
    """Isaac Lab observation groups -> our observation dict.

    ``state_group`` (concatenated, [N, D]) becomes ``state``; a non-concatenated group (a dict of terms) is flattened
    term by term in order; other groups keep their name (``critic`` -> ``critic``, for asymmetric actor-critics).
    Image terms ([N, H, W, C] tensors) become ``image_<term>`` uint8 [N, C, H, W] (floats in [0, 1] are scaled).
    """
    out: Obs = {}
    for name, value in groups.items():
        key = "state" if name == state_group else name
        if isinstance(value, Mapping):
            vectors = []
            for term, t in value.items():
                if t.dim() == 4:
                    out[f"image_{term}"] = to_uint8_chw(t)
                else:
                    vectors.append(t.reshape(t.shape[0], -1).float())
            if vectors:
                out[key] = torch.cat(vectors, dim=-1)
        elif value.dim() == 4:
            out[f"image_{name}"] = to_uint8_chw(value)
        else:
            out[key] = value.reshape(value.shape[0], -1).float()
    if "state" not in out:
        raise ValueError(f"Isaac Lab observation groups {sorted(groups)} have no {state_group!r} group for 'state'")
    return out


def to_uint8_chw(images: torch.Tensor) -> torch.Tensor:
    if images.dtype.is_floating_point:
        images = (images.clamp(0.0, 1.0) * 255.0).round()
    return images[..., :3].permute(0, 3, 1, 2).to(torch.uint8).contiguous()


def observation_space(single_space: gymnasium.spaces.Dict, state_group: str = "policy") -> gymnasium.spaces.Dict:
    """Our Dict space from Isaac Lab's ``single_observation_space`` (same rules as ``map_observations``)."""
    fake = {}
    for name, space in single_space.spaces.items():
        if isinstance(space, gymnasium.spaces.Dict):
            fake[name] = {term: torch.zeros(1, *s.shape) for term, s in space.spaces.items()}
        else:
            fake[name] = torch.zeros(1, *space.shape)
    spaces = {}
    for key, value in map_observations(fake, state_group).items():
        shape = tuple(value.shape[1:])
        spaces[key] = gymnasium.spaces.Box(0, 255, shape, np.uint8) if key.startswith("image_") \
            else gymnasium.spaces.Box(-np.inf, np.inf, shape, np.float32)
    return gymnasium.spaces.Dict(spaces)


def merge_final_obs(done: torch.Tensor, terminal: Obs, next_obs: Obs) -> Obs:
    """``final_obs``: the terminal observation for finished envs, the returned observation for the others."""
    out = {}
    for key, value in next_obs.items():
        mask = done.reshape(-1, *([1] * (value.dim() - 1)))
        out[key] = torch.where(mask, terminal[key], value)
    return out


def success_from_terms(terms: Mapping[str, torch.Tensor], success_terms: tuple[str, ...], num_envs: int,
                       device: torch.device) -> torch.Tensor:
    """Success = any of the named termination terms fired (Isaac Lab tasks have no standard success flag)."""
    success = torch.zeros(num_envs, dtype=torch.bool, device=device)
    for name in success_terms:
        if name not in terms:
            raise ValueError(f"success term {name!r} is not a termination term of this task; it has {sorted(terms)}")
        success |= terms[name].to(device=device, dtype=torch.bool)
    return success


def scale_actions(action: torch.Tensor, action_scale: float | torch.Tensor) -> torch.Tensor:
    """Our actions live in [-1, 1]; Isaac Lab's action spaces are unbounded and its action terms apply their own
    scale, so the adapter clips and multiplies by ``action_scale`` (1 by default, like RSL-RL's clip_actions=1)."""
    return action.clamp(-1.0, 1.0) * action_scale


# ---------------------------------------------------------------------- the live adapter
def require_isaaclab():
    try:
        import isaaclab  # noqa: F401
        import isaaclab_tasks  # noqa: F401  (registers the task ids)
        from isaaclab_tasks.utils import parse_env_cfg
    except ImportError as e:
        raise ImportError("isaaclab:<id> tasks need Isaac Lab and Isaac Sim (NVIDIA GPU; install from NVIDIA's package "
                          "index, see https://isaac-sim.github.io/IsaacLab), launched with isaaclab.app.AppLauncher "
                          "before rlrobot.make") from e
    return parse_env_cfg


class IsaacLabVecEnv:
    def __init__(self, task_id: str, num_envs: int, *, device: str | torch.device = "cuda:0", seed: int | None = None,
                 state_group: str = "policy", success_terms: tuple[str, ...] = (), action_scale: float = 1.0,
                 max_episode_steps: int | None = None, **cfg_overrides: Any):
        parse_env_cfg = require_isaaclab()
        self.device = torch.device(device)
        env_cfg = parse_env_cfg(task_id, device=str(self.device), num_envs=num_envs)
        if seed is not None:
            env_cfg.seed = seed
        if max_episode_steps is not None:
            env_cfg.episode_length_s = max_episode_steps * env_cfg.sim.dt * env_cfg.decimation
        for key, value in cfg_overrides.items():
            setattr(env_cfg, key, value)
        self.env = gymnasium.make(task_id, cfg=env_cfg)
        self.base = self.env.unwrapped
        self.task_id, self.num_envs = task_id, num_envs
        self.state_group, self.success_terms, self.action_scale = state_group, tuple(success_terms), action_scale
        self.single_observation_space = observation_space(self.base.single_observation_space, state_group)
        shape = self.base.single_action_space.shape
        self.action_dim = int(np.prod(shape))
        self.single_action_space = gymnasium.spaces.Box(-1.0, 1.0, shape, np.float32)
        self.max_episode_steps = int(self.base.max_episode_length)
        self._terminal: Obs | None = None
        self._wrap_reset_idx()
        self._returns = torch.zeros(num_envs, device=self.device)
        self._success_once = torch.zeros(num_envs, dtype=torch.bool, device=self.device)

    def _wrap_reset_idx(self) -> None:
        """Capture the observations right before Isaac Lab resets finished envs (the true final observations)."""
        base = self.base
        original = base._reset_idx

        def reset_idx(env_ids, *args, **kwargs):
            if hasattr(base, "observation_manager"):  # manager-based
                groups = base.observation_manager.compute(update_history=False)
            else:  # direct
                groups = base._get_observations()
            self._terminal = map_observations(groups, self.state_group)
            return original(env_ids, *args, **kwargs)

        base._reset_idx = reset_idx

    @property
    def instruction(self) -> list[str]:
        return [self.task_id] * self.num_envs

    def reset(self, seed: int | None = None) -> tuple[Obs, dict[str, Any]]:
        groups, _ = self.env.reset(seed=seed)
        self._returns.zero_()
        self._success_once.zero_()
        return map_observations(groups, self.state_group), {
            "success": torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)}

    def step(self, action: torch.Tensor) -> tuple[Obs, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        action = check_action(action, self.num_envs, self.action_dim, self.device)
        self._terminal = None
        lengths = self.base.episode_length_buf.clone() + 1  # Isaac Lab zeroes it for the envs it resets
        groups, reward, terminated, time_outs, extras = self.env.step(scale_actions(action, self.action_scale))
        obs = map_observations(groups, self.state_group)
        terminated = terminated.to(torch.bool)
        truncated = time_outs.to(torch.bool) & ~terminated
        done = terminated | truncated
        terms = {}
        if self.success_terms and hasattr(self.base, "termination_manager"):
            terms = {n: self.base.termination_manager.get_term(n) for n in self.success_terms}
        success = success_from_terms(terms, self.success_terms, self.num_envs, self.device)
        reward = reward.float()
        self._returns += reward
        self._success_once |= success
        info: dict[str, Any] = {"success": success, "log": extras.get("log", {})}
        if bool(done.any()):
            info["final_obs"] = merge_final_obs(done, self._terminal if self._terminal is not None else obs, obs)
            info["episode"] = episode_info(done, self._returns, lengths, success, self._success_once)
            self._returns[done] = 0.0
            self._success_once[done] = False
        else:
            info["final_obs"] = obs
        return obs, reward, terminated, truncated, info

    def close(self) -> None:
        self.env.close()
