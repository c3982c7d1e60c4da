"""Any registered gymnasium env as a VecEnv (sync or async), converted to same-step autoreset."""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from rlrobot.envs.vec_env import EpisodeTracker, Obs, check_action

VECTORIZATION_MODES = ("sync", "async")


class GymnasiumVecEnv:
    """Wraps ``gymnasium.make_vec(..., autoreset_mode=SAME_STEP)``; actions in [-1, 1] are rescaled to the Box."""

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        *,
        device: str | torch.device = "cpu",
        seed: int | None = None,
        vectorization_mode: str = "sync",
        max_episode_steps: int | None = None,
        **env_kwargs: Any,
    ):
        if vectorization_mode not in VECTORIZATION_MODES:
            raise ValueError(f"vectorization_mode={vectorization_mode!r} is not one of {VECTORIZATION_MODES}")
        kwargs = dict(env_kwargs)
        if max_episode_steps is not None:
            kwargs["max_episode_steps"] = max_episode_steps
        self.env = gymnasium.make_vec(
            env_id, num_envs, vectorization_mode=vectorization_mode,
            vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP}, **kwargs,
        )
        space = self.env.single_action_space
        if not isinstance(space, gymnasium.spaces.Box):
            raise ValueError(f"gym:{env_id} has action space {space}; only Box action spaces are supported")
        obs_space = self.env.single_observation_space
        if not isinstance(obs_space, gymnasium.spaces.Box):
            raise ValueError(f"gym:{env_id} has observation space {obs_space}; only Box observations are supported")
        self.env_id = env_id
        self.num_envs = num_envs
        self.device = torch.device(device)
        self._low, self._high = space.low.astype(np.float64), space.high.astype(np.float64)
        if not (np.isfinite(self._low).all() and np.isfinite(self._high).all()):
            raise ValueError(f"gym:{env_id} has an unbounded action space; cannot normalise it to [-1, 1]")
        self.single_action_space = gymnasium.spaces.Box(-1.0, 1.0, space.shape, np.float32)
        self.single_observation_space = gymnasium.spaces.Dict(
            {"state": gymnasium.spaces.Box(-np.inf, np.inf, obs_space.shape, np.float32)}
        )
        spec = self.env.spec
        self.max_episode_steps = int(max_episode_steps or (spec.max_episode_steps if spec else 0) or 1000)
        self.action_dim = int(np.prod(space.shape))
        self._seed = seed
        self._episodes = EpisodeTracker(num_envs)

    @property
    def instruction(self) -> list[str]:
        return [self.env_id] * self.num_envs

    def _obs(self, obs: np.ndarray) -> Obs:
        return {"state": torch.as_tensor(np.asarray(obs, np.float32), device=self.device)}

    def reset(self, seed: int | None = None) -> tuple[Obs, dict[str, Any]]:
        obs, _ = self.env.reset(seed=seed if seed is not None else self._seed)
        self._episodes.reset()
        return self._obs(obs), {"success": torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)}

    @staticmethod
    def _success(info: dict[str, Any], n: int) -> torch.Tensor:
        for key in ("success", "is_success"):
            if key in info:
                return torch.as_tensor(np.asarray(info[key], dtype=bool))
        return torch.zeros(n, dtype=torch.bool)

    def step(self, action: torch.Tensor) -> tuple[Obs, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        action = check_action(action, self.num_envs, self.action_dim, self.device)
        a = action.detach().cpu().double().numpy().clip(-1.0, 1.0)
        scaled = self._low + (a + 1.0) * 0.5 * (self._high - self._low)
        obs, reward, terminated, truncated, info = self.env.step(scaled.astype(self.env.single_action_space.dtype))
        reward_t = torch.as_tensor(np.asarray(reward, np.float32))
        term_t = torch.as_tensor(np.asarray(terminated, bool))
        trunc_t = torch.as_tensor(np.asarray(truncated, bool)) & ~term_t
        done = term_t | trunc_t
        final_info = info.get("final_info", {})
        success = self._success(info, self.num_envs)
        if done.any() and final_info:
            success = torch.where(done, self._success(final_info, self.num_envs), success)
        out: dict[str, Any] = {"success": success.to(self.device)}
        next_obs = self._obs(obs)
        episode = self._episodes.step(reward_t, success, done, self.device)
        if episode is not None:
            final = np.array(obs, dtype=np.float32, copy=True)
            mask = info["_final_obs"]
            final[mask] = np.stack(info["final_obs"][mask])
            out["final_obs"] = self._obs(final)
            out["episode"] = episode
        else:
            out["final_obs"] = next_obs
        d = self.device
        return next_obs, reward_t.to(d), term_t.to(d), trunc_t.to(d), out

    def close(self) -> None:
        self.env.close()
