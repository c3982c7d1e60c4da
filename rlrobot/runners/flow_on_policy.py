"""Flow-policy PPO runner (Flow-Noise / Flow-SDE): chunk rollouts -> GAE over chunks -> PPO on chain log-probs.

One macro step executes ``execute_steps`` actions of every env's chunk. Its reward is the sum of the step rewards up
to the first episode end inside the chunk; a time-out there adds gamma * V(final_obs); a chunk in which the episode
ends is ``done``. (An env whose episode ends mid-chunk runs the chunk's remaining actions in its new episode, as the
batch steps in lockstep; keep ``max_episode_steps`` a multiple of ``execute_steps`` so time-outs end on a chunk
boundary.)
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from rlrobot.algorithms.flow_ppo import FlowPPO
from rlrobot.config import TrainConfig
from rlrobot.data.rollout_storage import ChunkRolloutStorage
from rlrobot.runners.base import Runner, build_policy, check_compatible, console
from rlrobot.runners.checkpoint import load_checkpoint, restore_optimizer


def load_init_weights(cfg: TrainConfig, meta: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Weights of the ``--init`` checkpoint (``cfg.validate`` already adopted its architecture and checked its type);
    a checkpoint trained on other spaces is refused."""
    weights, saved, _ = load_checkpoint(cfg.init)
    check_compatible(saved, meta)
    return weights


class FlowOnPolicyRunner(Runner):
    def __init__(self, cfg: TrainConfig):
        super().__init__(cfg)
        init_weights = load_init_weights(cfg, self.meta) if cfg.init and not cfg.resume else None
        self.policy = build_policy(self.meta, cfg).to(self.device)
        if init_weights is not None:
            self.policy.load_state_dict(init_weights)
            console.print(f"initialised from {cfg.init}")
        elif not cfg.resume:
            console.print("[yellow]no --init checkpoint: the flow policy starts from random weights[/]")
        self.execute = cfg.executed_steps()
        self.algo = FlowPPO(self.policy, cfg.flow_ppo, cfg.algo, self.execute, self.device, sync=self.data_parallel)
        space = self.env.single_observation_space
        keys = tuple(cfg.flow.obs_keys)
        shapes = {k: tuple(space[k].shape) for k in keys}
        dtypes = {k: torch.uint8 if len(space[k].shape) == 3 else torch.float32 for k in keys}
        self.storage = ChunkRolloutStorage(cfg.flow_ppo.num_steps, cfg.num_envs, shapes, dtypes, cfg.flow.num_steps + 1,
                                           self.policy.flat_dim, self.algo.num_logged_steps, self.algo.executed_dim,
                                           self.device)
        self.generator = torch.Generator(device=self.device).manual_seed(self.seed)

    @property
    def steps_per_iteration(self) -> int:
        return self.cfg.steps_per_iteration()

    def trainer_state(self):
        return ({"rng.generator": self.generator.get_state()}, {"ppo_iterations": self.algo.iterations,
                "lr": self.algo.lr}, self.algo.optimizer, {})

    def restore_trainer_state(self, ckpt: Path, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        restore_optimizer(self.algo.optimizer, tensors, meta)
        self.algo.iterations, self.algo.lr = meta["ppo_iterations"], meta["lr"]
        self.generator.set_state(tensors["rng.generator"])

    def train_iteration(self) -> dict[str, float]:
        start = time.perf_counter()
        rollout_stats = self._rollout()
        rollout_time = time.perf_counter() - start
        from rlrobot.tasks.mujoco_vec_env import default_num_threads

        torch.set_num_threads(self.cfg.update_threads or default_num_threads())
        try:
            update_stats = self.algo.update(self.storage, self.generator)
        finally:
            torch.set_num_threads(self.cfg.torch_threads)
        self.storage.clear()
        return {"perf/rollout_fraction": rollout_time / (time.perf_counter() - start),
                **{f"loss/{k}": v for k, v in update_stats.items()}, **rollout_stats}

    def _rollout(self) -> dict[str, float]:
        cfg, env, policy, algo = self.cfg, self.env, self.policy, self.algo
        gamma = cfg.flow_ppo.gamma
        keys = tuple(cfg.flow.obs_keys)
        with torch.inference_mode():
            obs = self.obs
            for _ in range(cfg.flow_ppo.num_steps):
                actions, chain, steps, log_probs, value = algo.act(obs, self.generator)
                chunk_reward = torch.zeros(env.num_envs, device=self.device)
                alive = torch.ones(env.num_envs, dtype=torch.bool, device=self.device)
                for j in range(self.execute):
                    next_obs, reward, terminated, truncated, info = env.step(actions[:, j].clamp(-1.0, 1.0))
                    chunk_reward += reward * alive
                    timeout = truncated & alive
                    if timeout.any():  # bootstrap time-outs with the value of the true final observation
                        chunk_reward += gamma * policy.value(info["final_obs"]) * timeout
                    alive &= ~(terminated | truncated)
                    self.track_episodes(info)
                    if j == 0:
                        first_obs = obs
                    obs = next_obs
                self.storage.add({k: first_obs[k] for k in keys}, chain, steps, log_probs, value, chunk_reward,
                                 (~alive).float())
            last_values = policy.value(obs)
        self.obs = obs
        self.storage.compute_returns(last_values, gamma, cfg.flow_ppo.lam)
        return {"train/value_mean": float(self.storage.values.mean()),
                "train/chunk_reward_mean": float(self.storage.rewards.mean())}
