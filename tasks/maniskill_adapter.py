"""ManiSkill3 tasks (``maniskill:PushCube-v1``, ``maniskill:PickCube-v1``, ...) as a VecEnv.

ManiSkill's own ``ManiSkillVectorEnv`` already speaks our contract's dialect (same-step autoreset, torch tensors,
``final_observation``): this adapter maps names and shapes. On the GPU sim one ManiSkill env holds all ``num_envs``
sub-scenes. ManiSkill's CPU sim allows one env per env object, so on the CPU the adapter holds ``num_envs`` of them
and steps them in turn (a per-env loop, there only; the CPU path exists for tests and small runs).

Observations: ``obs_mode="state"`` -> ``{"state"}``; ``"state+rgb"`` / ``"rgb"`` -> ``{"state"?, "image_<camera>"}``
(uint8 [3, H, W] per camera, via ManiSkill's FlattenRGBDObservationWrapper). Actions in [-1, 1] are rescaled to the
controller's Box. ManiSkill needs a Vulkan device even for state observations (Mesa >= 24.3's lavapipe on
a CPU machine).
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
import torch

from rlrobot.envs.vec_env import EpisodeTracker, Obs, check_action
from rlrobot.errors import MissingSystemDependency

SIM_BACKENDS = ("auto", "cpu", "gpu")
MANISKILL_OBS_MODES = ("state", "rgb", "state+rgb")


def require_maniskill():
    try:
        import mani_skill.envs  # noqa: F401  (registers the env ids)
        from mani_skill.vector.wrappers.gymnasium import ManiSkillVectorEnv
    except ImportError as e:
        raise ImportError("maniskill:<id> tasks need ManiSkill3: pip install 'rlrobot[maniskill]' (mani-skill 3.0.1, "
                          "sapien 3.0.3) and a Vulkan driver (Debian: mesa-vulkan-drivers >= 24.3)") from e
    return ManiSkillVectorEnv


def registered_ids() -> list[str]:
    require_maniskill()
    from mani_skill.utils.registration import REGISTERED_ENVS

    return sorted(REGISTERED_ENVS)


class ManiSkillVecEnv:
    def __init__(self, env_id: str, num_envs: int, *, device: str | torch.device = "cpu", seed: int | None = None,
                 obs_mode: str = "state", control_mode: str | None = None, reward_mode: str = "normalized_dense",
                 sim_backend: str = "auto", max_episode_steps: int | None = None, **env_kwargs: Any):
        vector_env = require_maniskill()
        if obs_mode not in MANISKILL_OBS_MODES:
            raise ValueError(f"obs_mode={obs_mode!r} is not one of {MANISKILL_OBS_MODES}")
        if sim_backend not in SIM_BACKENDS:
            raise ValueError(f"sim_backend={sim_backend!r} is not one of {SIM_BACKENDS}")
        if env_id not in registered_ids():
            raise ValueError(f"maniskill:{env_id} is not a registered ManiSkill env id")
        self.device = torch.device(device)
        if sim_backend == "auto":
            sim_backend = "gpu" if self.device.type == "cuda" and torch.cuda.is_available() else "cpu"
        self.env_id, self.num_envs, self.sim_backend, self.obs_mode = env_id, num_envs, sim_backend, obs_mode
        kwargs: dict[str, Any] = {"obs_mode": "state" if obs_mode == "state" else "rgb", "reward_mode": reward_mode,
                                  "sim_backend": sim_backend, **env_kwargs}
        if control_mode is not None:
            kwargs["control_mode"] = control_mode
        if max_episode_steps is not None:
            kwargs["max_episode_steps"] = max_episode_steps
        # episode resets draw their randomness from ManiSkill's seeded RNGs, not torch's global one: a seeded
        # reset(seed) reproduces every later autoreset too
        kwargs.setdefault("enhanced_determinism", True)
        if obs_mode == "state":
            kwargs.setdefault("render_backend", "none")  # no cameras needed: skip the renderer
        sizes = [num_envs] if sim_backend == "gpu" else [1] * num_envs
        self._subs = [vector_env(self._make(n, kwargs), n, auto_reset=True, ignore_terminations=False,
                                 record_metrics=False) for n in sizes]
        first = self._subs[0]
        space = first.single_action_space
        if not isinstance(space, gymnasium.spaces.Box):
            raise ValueError(f"maniskill:{env_id} has action space {space}; only Box action spaces are supported")
        self._low = torch.as_tensor(space.low, dtype=torch.float32)
        self._high = torch.as_tensor(space.high, dtype=torch.float32)
        self.action_dim = int(np.prod(space.shape))
        self.single_action_space = gymnasium.spaces.Box(-1.0, 1.0, space.shape, np.float32)
        self.single_observation_space = gymnasium.spaces.Dict(self._obs_spaces(first.single_observation_space))
        self.max_episode_steps = int(max_episode_steps or first.base_env.spec.max_episode_steps
                                     or _registered_max_steps(env_id) or 0)
        self.control_mode = first.base_env.control_mode
        self._seed = seed
        self._episodes = EpisodeTracker(num_envs)

    def _make(self, n: int, kwargs: dict[str, Any]):
        try:
            env = gymnasium.make(self.env_id, num_envs=n, **kwargs)
        except RuntimeError as e:
            if "rendering device" not in str(e):
                raise
            raise MissingSystemDependency(
                f"maniskill:{self.env_id}: SAPIEN found no Vulkan device ({e}); ManiSkill needs one even for state "
                "observations: on a CPU machine Mesa's lavapipe >= 24.3 (Debian bookworm: mesa-vulkan-drivers from "
                "bookworm-backports), on a GPU machine the NVIDIA driver's Vulkan ICD") from e
        if self.obs_mode != "state":
            from mani_skill.utils.wrappers.flatten import FlattenRGBDObservationWrapper

            env = FlattenRGBDObservationWrapper(env, rgb=True, depth=False, state=True)
        return env

    def _obs_spaces(self, space) -> dict[str, gymnasium.spaces.Space]:
        if self.obs_mode == "state":
            return {"state": gymnasium.spaces.Box(-np.inf, np.inf, space.shape[-1:], np.float32)}
        out: dict[str, gymnasium.spaces.Space] = {}
        if "state" in self.obs_mode:
            out["state"] = gymnasium.spaces.Box(-np.inf, np.inf, space["state"].shape[-1:], np.float32)
        h, w, channels = space["rgb"].shape[-3:]
        for cam in self.cameras:
            out[f"image_{cam}"] = gymnasium.spaces.Box(0, 255, (3, h, w), np.uint8)
        assert channels == 3 * len(self.cameras)
        return out

    @property
    def cameras(self) -> list[str]:
        return list(self._subs[0].base_env._sensors)  # the order FlattenRGBDObservationWrapper concatenates them

    @property
    def instruction(self) -> list[str]:
        return [self.env_id] * self.num_envs

    # ------------------------------------------------------------------ conversion (pure: tested on fake tensors)
    def _convert_obs(self, raw) -> Obs:
        return convert_observation(raw, self.obs_mode, self.cameras, self.device)

    def reset(self, seed: int | None = None) -> tuple[Obs, dict[str, Any]]:
        seed = seed if seed is not None else self._seed
        raws = []
        for i, sub in enumerate(self._subs):
            obs, _ = sub.reset(seed=None if seed is None else seed + i)
            raws.append(obs)
        self._episodes.reset()
        return self._convert_obs(_concat(raws)), {"success": torch.zeros(self.num_envs, dtype=torch.bool,
                                                                          device=self.device)}

    def step(self, action: torch.Tensor) -> tuple[Obs, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        action = check_action(action, self.num_envs, self.action_dim, self.device)
        scaled = self._low + (action.detach().float().cpu().clamp(-1.0, 1.0) + 1.0) * 0.5 * (self._high - self._low)
        obs_parts, final_parts, rewards, terms, truncs, successes = [], [], [], [], [], []
        start = 0
        for sub in self._subs:
            n = sub.num_envs
            sim_action = scaled[start:start + n].to(sub.device)
            obs, reward, terminated, truncated, info = sub.step(sim_action)
            done = _bool(terminated, n) | _bool(truncated, n)
            success = _bool(info.get("success", torch.zeros(n, dtype=torch.bool)), n)
            final = obs
            if bool(done.any()):
                final_info = info["final_info"]
                success = torch.where(done, _bool(final_info.get("success", success), n), success)
                final = _where_done(done, info["final_observation"], obs)
            obs_parts.append(obs)
            final_parts.append(final)
            rewards.append(torch.as_tensor(reward, dtype=torch.float32).reshape(n).cpu())
            terms.append(_bool(terminated, n))
            truncs.append(_bool(truncated, n))
            successes.append(success)
            start += n
        reward_t, term_t = torch.cat(rewards), torch.cat(terms)
        trunc_t = torch.cat(truncs) & ~term_t
        success_t = torch.cat(successes)
        done = term_t | trunc_t
        next_obs = self._convert_obs(_concat(obs_parts))
        out: dict[str, Any] = {"success": success_t.to(self.device)}
        episode = self._episodes.step(reward_t, success_t, done, self.device)
        if episode is not None:
            out["final_obs"] = self._convert_obs(_concat(final_parts))
            out["episode"] = episode
        else:
            out["final_obs"] = next_obs
        d = self.device
        return next_obs, reward_t.to(d), term_t.to(d), trunc_t.to(d), out

    def close(self) -> None:
        for sub in self._subs:
            sub.close()


def convert_observation(raw, obs_mode: str, cameras: list[str], device: torch.device) -> Obs:
    """ManiSkill observation (a state tensor, or FlattenRGBD's {"state", "rgb": [N, H, W, 3 * cameras]}) -> ours."""
    if obs_mode == "state":
        return {"state": torch.as_tensor(raw, dtype=torch.float32).to(device)}
    out: Obs = {}
    if "state" in obs_mode:
        out["state"] = torch.as_tensor(raw["state"], dtype=torch.float32).to(device)
    rgb = torch.as_tensor(raw["rgb"]).to(device)
    for c, cam in enumerate(cameras):
        out[f"image_{cam}"] = rgb[..., 3 * c:3 * c + 3].permute(0, 3, 1, 2).to(torch.uint8).contiguous()
    return out


def _bool(x, n: int) -> torch.Tensor:
    return torch.as_tensor(x, dtype=torch.bool).reshape(n).cpu()


def _concat(parts):
    if isinstance(parts[0], dict):
        return {k: _concat([p[k] for p in parts]) for k in parts[0]}
    return torch.cat([torch.as_tensor(p).cpu() for p in parts])


def _where_done(done: torch.Tensor, final, obs):
    if isinstance(obs, dict):
        return {k: _where_done(done, final[k], obs[k]) for k in obs}
    mask = done.to(obs.device).reshape(-1, *([1] * (obs.dim() - 1)))
    return torch.where(mask, final, obs)


def _registered_max_steps(env_id: str) -> int | None:
    from mani_skill.utils.registration import REGISTERED_ENVS

    spec = REGISTERED_ENVS.get(env_id)
    return getattr(spec, "max_episode_steps", None)
