"""The Flow-SRPO runner: grouped whole-episode rollouts (Flow-NFT's ``group_starts``), SRPO rewards from trajectory
embeddings, GRPO advantages per group, Flow-Noise PPO's update (``rlrobot.algorithms.flow_srpo``)."""

from __future__ import annotations

import time

import torch

from rlrobot.algorithms.flow_ppo import FlowPPO
from rlrobot.config import TrainConfig
from rlrobot.rewards.progress_reward import prm_features
from rlrobot.rewards.srpo import (
    group_filter,
    instruction_ids,
    srpo_advantages,
    srpo_rewards,
    standardise,
    state_features,
    trajectory_embeddings,
)
from rlrobot.runners.flow_on_policy import FlowNFTRunner, FlowOnPolicyRunner


class FlowSRPORunner(FlowOnPolicyRunner):
    group_starts = FlowNFTRunner.group_starts  # reset, then every group of group_size envs gets its first env's start

    def __init__(self, cfg: TrainConfig):
        super().__init__(cfg)
        section = cfg.flow_srpo
        if section.encoder:
            self.features, self.standardise = prm_features(section.encoder[4:], self.env, self.device), False
        else:
            self.features, self.standardise = state_features, True

    def make_algorithm(self) -> FlowPPO:
        cfg = self.cfg
        return FlowPPO(self.policy, cfg.flow_srpo, "noise", self.device, cfg.num_envs, self.obs_specs(self.obs_keys),
                       sync=self.data_parallel)

    @property
    def section(self):
        return self.cfg.flow_srpo

    def train_iteration(self) -> dict[str, float]:
        """As flow-policy PPO's, except that a rollout in which the group filter kept no group (all outcomes equal: no
        ranking to learn from) skips the update: otherwise the noise head's entropy bonus alone would move the policy
        (measured on so101-push-to from a 6 % SFT policy: 0 groups kept for 20 iterations, eval 0.06 -> 0)."""
        start = time.perf_counter()
        rollout_stats = self._rollout()
        rollout_time = time.perf_counter() - start
        update_stats: dict[str, float] = {"skipped_update": 1.0}
        if rollout_stats["train/groups_kept"] > 0:
            with self.all_cores():
                self.algo.begin_iteration(self.iteration, self.total_iterations)
                update_stats = {**self.algo.update(self.generator), "skipped_update": 0.0}
        self.algo.storage.clear()
        return {"perf/rollout_fraction": rollout_time / (time.perf_counter() - start),
                **{f"loss/{k}": v for k, v in update_stats.items()}, **rollout_stats}

    def _rollout(self) -> dict[str, float]:
        """One whole episode per env from grouped start states; each episode's chunks get its group's SRPO advantage.
        Chunks after an early episode end (a new episode without an outcome) get 0."""
        env, algo, section = self.env, self.algo, self.section
        n = env.num_envs
        success = torch.zeros(n, dtype=torch.bool, device=self.device)
        finished = torch.zeros(n, dtype=torch.bool, device=self.device)
        frames, valid, live_chunks = [], [], []
        with torch.inference_mode():
            obs = self.group_starts()
            tasks = instruction_ids(list(env.instruction), self.device)  # fixed for the episode
            frames.append(self.features(obs))
            valid.append(torch.ones(n, dtype=torch.bool, device=self.device))
            for _ in range(section.rollout_chunks):
                actions, fields, _ = algo.rollout_act(obs, self.generator)
                chunk_obs = {k: obs[k] for k in self.obs_keys}
                live_chunks.append(~finished)
                for j in range(self.execute_steps):
                    alive = ~finished
                    obs, _, _, _, info = env.step(actions[:, j].clamp(-1.0, 1.0))
                    frames.append(self.features(info["final_obs"]))
                    valid.append(alive)
                    if "episode" in info:
                        ep = info["episode"]
                        ids = ep["env_ids"].to(self.device)
                        first = ~finished[ids]
                        success[ids[first]] = ep["success"].to(self.device).bool()[first]
                        finished[ids] = True
                    self.track_episodes(info)
                zeros = torch.zeros(n, device=self.device)
                algo.storage.add(chunk_obs, **fields, values=zeros, rewards=zeros, dones=zeros)
        self.obs = obs
        # outside inference mode: the advantages enter the loss's autograd graph
        frames_t, valid_t = torch.stack(frames).float(), torch.stack(valid)
        if self.standardise:
            frames_t = standardise(frames_t, valid_t)
        emb = trajectory_embeddings(frames_t, valid_t)
        success, finished = success.clone(), finished.clone()
        rewards = srpo_rewards(emb, success & finished, tasks.clone(), section.settings)
        keep = group_filter(success & finished, section.group_size, section.low, section.high)
        keep &= finished.reshape(-1, section.group_size).all(1).repeat_interleave(section.group_size)
        advantages = srpo_advantages(rewards, section.group_size, keep)
        live = torch.stack(live_chunks)
        algo.storage.advantages = torch.where(live, advantages[None, :].expand_as(live), torch.zeros_like(live, dtype=torch.float32))
        algo.storage.returns = torch.zeros_like(algo.storage.advantages)
        failed = finished & ~success
        return {"train/srpo_reward_mean": float(rewards[finished].mean()) if finished.any() else 0.0,
                "train/srpo_failure_reward_mean": float(rewards[failed].mean()) if failed.any() else 0.0,
                "train/group_success_rate": float(success[finished].float().mean()) if finished.any() else 0.0,
                "train/groups_kept": float(keep.float().mean())}
