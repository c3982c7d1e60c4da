"""SFT runner: flow matching on a LeRobotDataset, periodic evaluation in the task (chunks run open-loop for
``execute_steps`` actions, then re-planned), checkpoints that flow-policy RL starts from (``--init``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from rlrobot.algorithms.sft import FlowSFT
from rlrobot.config import TrainConfig
from rlrobot.data.demonstrations import load_demonstrations
from rlrobot.runners.base import Runner, build_policy, console
from rlrobot.runners.checkpoint import restore_optimizer


class SFTRunner(Runner):
    def __init__(self, cfg: TrainConfig):
        super().__init__(cfg)
        space = self.env.single_observation_space
        self.demos = load_demonstrations(cfg.dataset, {k: tuple(v.shape) for k, v in space.spaces.items()},
                                         self.meta["action_dim"], cfg.flow.chunk_size, tuple(cfg.flow.obs_keys),
                                         control_mode=cfg.control_mode if ":" not in cfg.task else None, task=cfg.task,
                                         max_episodes=cfg.sft.max_episodes)
        self.policy = build_policy(self.meta, cfg).to(self.device)
        if "state" in self.demos.obs:
            state = self.demos.obs["state"]
            self.policy.set_state_stats(state.mean(0).to(self.device), state.std(0).to(self.device))
        self.algo = FlowSFT(self.policy, self.demos, cfg.sft, self.device, sync=self.data_parallel)
        self.generator = torch.Generator(device=self.device).manual_seed(self.seed)
        self.meta["dataset"] = {"path": str(Path(cfg.dataset).resolve()), "episodes": self.demos.num_episodes,
                                "frames": len(self.demos)}
        if self.is_main:
            console.print(f"SFT on {self.demos.num_episodes} episodes ({len(self.demos)} frames) of {cfg.dataset}")

    @property
    def steps_per_iteration(self) -> int:
        return 0  # SFT does not step the environment

    @property
    def total_iterations(self) -> int:
        return math.ceil(self.cfg.sft.num_updates / self.cfg.sft.updates_per_iteration)

    @property
    def log_step(self) -> int:
        return self.algo.updates

    def status_line(self, metrics: dict[str, float]) -> str:
        return f"flow-matching loss {metrics['loss/flow_matching']:.4f}  lr {metrics['loss/lr']:.2e}"

    def train_iteration(self) -> dict[str, float]:
        from rlrobot.tasks.mujoco_vec_env import default_num_threads

        remaining = self.cfg.sft.num_updates - self.algo.updates
        torch.set_num_threads(self.cfg.update_threads or default_num_threads())  # the simulator is idle
        try:
            stats = self.algo.update(min(self.cfg.sft.updates_per_iteration, remaining), self.generator)
        finally:
            torch.set_num_threads(self.cfg.torch_threads)
        return {f"loss/{k}": v for k, v in stats.items()}

    def trainer_state(self):
        return ({"rng.generator": self.generator.get_state()}, {"updates": self.algo.updates}, self.algo.optimizer, {})

    def restore_trainer_state(self, ckpt: Path, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        restore_optimizer(self.algo.optimizer, tensors, meta)
        self.algo.updates = meta["updates"]
        self.generator.set_state(tensors["rng.generator"])
