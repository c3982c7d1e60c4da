"""On-policy runner: rollout (under inference mode) -> PPO update -> log / evaluate / checkpoint, resumable.

A training-env wrapper that replaces the policy's action (JSRL's guide) marks those steps in ``info[POLICY_ACTED]``,
which becomes the storage's mask: PPO trains on the steps its policy chose only. With ``--ppo.overlap`` the next
rollout is collected while the update runs (``rlrobot.runners.overlap``)."""

from __future__ import annotations

import time

import torch

from rlrobot.algorithms.ppo import PPO
from rlrobot.config import TrainConfig
from rlrobot.envs.vec_env import POLICY_ACTED
from rlrobot.runners.base import Runner


class OnPolicyRunner(Runner):
    cheap_env_steps = True

    def __init__(self, cfg: TrainConfig):
        super().__init__(cfg)
        self.policy = self.build_policy()
        self.algo = PPO(self.policy, cfg.ppo, self.device, cfg.num_envs, self.obs_specs(cfg.policy.read_keys),
                        sync=self.data_parallel)
        if cfg.ppo.overlap:
            self.start_overlap(self.algo.storage)

    def train_iteration(self) -> dict[str, float]:
        if self.overlap is not None:
            iteration = self.iteration
            return self.overlap.iteration(self.policy, self.algo, lambda policy, storage, _: self._rollout(policy, storage),
                                          lambda: self._learn_rollout(iteration), drain=self.pauses_after(iteration + 1))
        start = time.perf_counter()
        rollout_stats = self._rollout()
        rollout_time = time.perf_counter() - start
        update_stats = self.update()
        return {"perf/rollout_fraction": rollout_time / (time.perf_counter() - start),
                **{f"loss/{k}": v for k, v in update_stats.items()}, **rollout_stats}

    def update(self) -> dict[str, float]:
        """PPO update, then the normaliser sees the rollout's observations; all cores while the simulator is idle."""
        with self.all_cores():
            stats = self._learn_rollout(self.iteration)
        self.algo.storage.clear()
        return stats

    def _learn_rollout(self, iteration: int) -> dict[str, float]:
        """The update of the rollout in ``algo.storage`` (iteration ``iteration``'s), then the normaliser's."""
        self.algo.begin_iteration(iteration, self.total_iterations)
        stats = self.algo.update(self.generator)
        obs = self.algo.storage.obs
        self.policy.update_normalizer(self.gather_obs({k: v.reshape(-1, *v.shape[2:]) for k, v in obs.items()}))
        return stats

    def _rollout(self, policy=None, storage=None) -> dict[str, float]:
        """Collect ``ppo.rollout_steps`` steps into ``storage`` (the algorithm's) acting with ``policy`` (the learner)."""
        cfg, env, algo = self.cfg, self.env, self.algo
        policy = self.policy if policy is None else policy
        storage = algo.storage if storage is None else storage
        keys = cfg.policy.read_keys
        gamma = cfg.ppo.gamma
        with torch.inference_mode():
            obs = self.obs
            for _ in range(cfg.ppo.rollout_steps):
                action, log_prob, value, mean, std = algo.act(obs, policy)
                next_obs, reward, terminated, truncated, info = env.step(action.clamp(-1.0, 1.0))
                done = terminated | truncated
                reward = algo.scale_rewards(reward, done)
                if truncated.any():
                    # bootstrap time-outs with the value of the true final observation (same-step autoreset)
                    final_value = policy.value(info["final_obs"])
                    reward = reward + gamma * final_value * truncated.float()
                storage.add({k: obs[k] for k in keys}, info.get(POLICY_ACTED), actions=action, log_probs=log_prob,
                            values=value, rewards=reward, dones=done.float(), action_mean=mean, action_std=std)
                self.track_episodes(info)
                obs = next_obs
            last_values = policy.value(obs)
        self.obs = obs
        storage.compute_returns(last_values, gamma, cfg.ppo.lam)
        return {"train/value_mean": float(storage.values.mean())}
