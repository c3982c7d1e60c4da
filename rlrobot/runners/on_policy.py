"""On-policy runner: rollout (under inference mode) -> PPO update -> log / evaluate / checkpoint, resumable."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from rlrobot.algorithms.ppo import PPO
from rlrobot.config import TrainConfig
from rlrobot.data.rollout_storage import RolloutStorage
from rlrobot.runners.base import Runner, build_policy, check_compatible, policy_metadata  # noqa: F401 (re-exported)
from rlrobot.runners.checkpoint import restore_optimizer


class OnPolicyRunner(Runner):
    def __init__(self, cfg: TrainConfig):
        super().__init__(cfg)
        self.policy = build_policy(self.meta, cfg).to(self.device)
        self.algo = PPO(self.policy, cfg.ppo, self.device, sync=self.data_parallel)
        space = self.env.single_observation_space
        key = cfg.policy.obs_key
        self.storage = RolloutStorage(cfg.ppo.num_steps, cfg.num_envs, {key: space[key].shape},
                                      self.meta["action_dim"], self.device)
        self.generator = torch.Generator(device=self.device).manual_seed(self.seed)

    @property
    def steps_per_iteration(self) -> int:
        return self.cfg.num_envs * self.cfg.ppo.num_steps

    def trainer_state(self):
        return ({"rng.generator": self.generator.get_state()}, {"lr": self.algo.lr}, self.algo.optimizer, {})

    def restore_trainer_state(self, ckpt: Path, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        restore_optimizer(self.algo.optimizer, tensors, meta)
        self.algo.lr = meta["lr"]
        for group in self.algo.optimizer.param_groups:
            group["lr"] = self.algo.lr
        self.generator.set_state(tensors["rng.generator"])

    def train_iteration(self) -> dict[str, float]:
        start = time.perf_counter()
        rollout_stats = self._rollout()
        rollout_time = time.perf_counter() - start
        update_stats = self.update()
        return {"perf/rollout_fraction": rollout_time / (time.perf_counter() - start),
                **{f"loss/{k}": v for k, v in update_stats.items()}, **rollout_stats}

    def update(self) -> dict[str, float]:
        """PPO update with all cores for torch (the simulator threads are idle now), then back to rollout threads."""
        from rlrobot.tasks.mujoco_vec_env import default_num_threads

        torch.set_num_threads(self.cfg.update_threads or default_num_threads())
        try:
            stats = self.algo.update(self.storage, self.generator)
            self.policy.update_normalizer(self.gather_obs({k: v.reshape(-1, *v.shape[2:]) for k, v in self.storage.obs.items()}))
        finally:
            torch.set_num_threads(self.cfg.torch_threads)
        self.storage.clear()
        return stats

    def _rollout(self) -> dict[str, float]:
        cfg, env, policy, algo = self.cfg, self.env, self.policy, self.algo
        key = cfg.policy.obs_key
        gamma = cfg.ppo.gamma
        with torch.inference_mode():
            obs = self.obs
            for _ in range(cfg.ppo.num_steps):
                action, log_prob, value, mean, std = algo.act(obs)
                next_obs, reward, terminated, truncated, info = env.step(action.clamp(-1.0, 1.0))
                if truncated.any():
                    # bootstrap time-outs with the value of the true final observation (same-step autoreset)
                    final_value = policy.value(info["final_obs"])
                    reward = reward + gamma * final_value * truncated.float()
                self.storage.add({key: obs[key]}, action, log_prob, value, reward,
                                 (terminated | truncated).float(), mean, std)
                self.track_episodes(info)
                obs = next_obs
            last_values = policy.value(obs)
        self.obs = obs
        self.storage.compute_returns(last_values, gamma, cfg.ppo.lam)
        return {"train/value_mean": float(self.storage.values.mean())}
