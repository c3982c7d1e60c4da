"""Off-policy runner: collect from all envs at once into the device replay buffer, then run UTD x transitions SAC
updates; log / evaluate / checkpoint (optionally with the replay buffer, ``--save-replay``), resumable.

One iteration = ``sac.steps_per_iteration`` vector steps (x num_envs transitions) followed by
``utd x transitions`` gradient updates (the fractional part carries over, so any UTD is honoured on average).
Until ``sac.learning_starts`` transitions exist, actions are uniform in [-1, 1] and nothing is updated.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from rlrobot.algorithms.sac import SAC
from rlrobot.config import TrainConfig
from rlrobot.data.replay_buffer import ReplayBuffer
from rlrobot.runners.base import Runner, build_policy, console
from rlrobot.runners.checkpoint import load_extra_file, restore_optimizer

REPLAY_FILE = "replay"


class OffPolicyRunner(Runner):
    def __init__(self, cfg: TrainConfig):
        super().__init__(cfg)
        self.policy = build_policy(self.meta, cfg).to(self.device)
        self.algo = SAC(self.policy, cfg.sac, self.device, sync=self.data_parallel)
        space = self.env.single_observation_space
        self.obs_keys = [cfg.policy.obs_key]  # what the networks read; images join when encoders do
        self.replay = ReplayBuffer(
            cfg.sac.buffer_size, cfg.num_envs, {k: space[k].shape for k in self.obs_keys}, self.meta["action_dim"],
            self.device, obs_dtypes={k: _torch_dtype(space[k].dtype) for k in self.obs_keys},
            n_step=cfg.sac.n_step, gamma=cfg.sac.gamma)
        self.generator = torch.Generator(device=self.device).manual_seed(self.seed)
        self.update_debt = 0.0  # fractional updates carried to the next iteration
        self.num_updates = 0

    @property
    def steps_per_iteration(self) -> int:
        return self.cfg.num_envs * self.cfg.sac.steps_per_iteration

    # ------------------------------------------------------------------ checkpoints
    def trainer_state(self):
        tensors = {"rng.generator": self.generator.get_state(), "sac.log_alpha": self.algo.log_alpha.detach()}
        meta: dict[str, Any] = {"update_debt": self.update_debt, "num_updates": self.num_updates,
                                "algo_updates": self.algo.num_updates, "replay": None}
        extra: dict[str, dict[str, torch.Tensor]] = {}
        if self.cfg.save_replay:
            extra[REPLAY_FILE], meta["replay"] = self.replay.state_dict()
        return tensors, meta, self.algo.optimizers, extra

    def restore_trainer_state(self, ckpt: Path, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        for name, optimizer in self.algo.optimizers.items():
            restore_optimizer(optimizer, tensors, meta, name)
        with torch.no_grad():
            self.algo.log_alpha.copy_(tensors["sac.log_alpha"])
        self.generator.set_state(tensors["rng.generator"])
        self.update_debt, self.num_updates = meta["update_debt"], meta["num_updates"]
        self.algo.num_updates = meta["algo_updates"]
        replay = load_extra_file(ckpt, REPLAY_FILE) if meta.get("replay") else None
        if replay is not None:
            self.replay.load_state_dict(replay, meta["replay"])

    def after_restore(self, ckpt: Path) -> None:
        if len(self.replay) == 0:
            console.print(f"[yellow]{ckpt} holds no replay buffer (train with --save-replay to keep it): the buffer "
                          f"refills with {self.cfg.sac.learning_starts:,} transitions from the current policy before "
                          "updates resume[/]")
        else:
            console.print(f"replay buffer restored: {len(self.replay):,} transitions")

    # ------------------------------------------------------------------ training
    def train_iteration(self) -> dict[str, float]:
        cfg, sac = self.cfg, self.cfg.sac
        start = time.perf_counter()
        self._collect()
        collect_time = time.perf_counter() - start
        metrics: dict[str, float] = {"perf/rollout_fraction": 1.0, "train/replay_size": float(len(self.replay))}
        if len(self.replay) < sac.learning_starts:
            return metrics
        self.update_debt += sac.utd * self.steps_per_iteration
        num_updates = int(self.update_debt)
        self.update_debt -= num_updates
        if num_updates == 0:
            return metrics
        from rlrobot.tasks.mujoco_vec_env import default_num_threads

        torch.set_num_threads(cfg.update_threads or default_num_threads())  # the simulator is idle during updates
        update_start = time.perf_counter()
        try:
            sums: dict[str, torch.Tensor] = {}
            counts: dict[str, int] = {}
            for _ in range(num_updates):
                batch = self.replay.sample(sac.batch_size, self.generator)
                for k, v in self.algo.update(batch, self.generator).items():
                    sums[k] = sums.get(k, 0.0) + v
                    counts[k] = counts.get(k, 0) + 1
        finally:
            torch.set_num_threads(cfg.torch_threads)
        update_time = time.perf_counter() - update_start
        self.num_updates += num_updates
        metrics.update({f"loss/{k}": float(v) / counts[k] for k, v in sums.items()})
        metrics.update({"perf/rollout_fraction": collect_time / (collect_time + update_time),
                        "perf/updates_per_s": num_updates / update_time, "train/updates": float(self.num_updates)})
        return metrics

    def _collect(self) -> None:
        cfg, env, policy = self.cfg, self.env, self.policy
        # per rank: each rank's buffer must hold learning_starts transitions; a resumed run without replay refills
        # on-policy
        random_phase = self.env_steps // self.sync.world_size < cfg.sac.learning_starts
        with torch.inference_mode():
            obs = self.obs
            for _ in range(cfg.sac.steps_per_iteration):
                if random_phase:
                    action = torch.rand(cfg.num_envs, self.meta["action_dim"], device=self.device,
                                        generator=self.generator) * 2.0 - 1.0
                else:
                    action = policy.act(obs)
                next_obs, reward, terminated, truncated, info = env.step(action)
                self.replay.add(obs, action, reward, terminated, truncated, next_obs, info["final_obs"])
                key = self.cfg.policy.obs_key
                policy.update_normalizer(self.gather_obs({key: obs[key]}))
                self.track_episodes(info)
                obs = next_obs
        self.obs = obs


def _torch_dtype(np_dtype) -> torch.dtype:
    import numpy as np

    return torch.uint8 if np.dtype(np_dtype) == np.uint8 else torch.float32
