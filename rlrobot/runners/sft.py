"""SFT runner: flow matching on a LeRobotDataset, periodic evaluation in the task (chunks run open-loop for
``flow.execute_steps`` actions, then re-planned), checkpoints that flow-policy RL starts from (``--init``)."""

from __future__ import annotations

import math
from pathlib import Path

from rlrobot.algorithms.sft import FlowSFT
from rlrobot.config import TrainConfig
from rlrobot.data.demonstrations import load_demonstrations
from rlrobot.runners.base import Runner, console
from rlrobot.tasks.registry import is_adapter_task


class SFTRunner(Runner):
    def __init__(self, cfg: TrainConfig):
        super().__init__(cfg)
        space = self.env.single_observation_space
        self.demos = load_demonstrations(cfg.dataset, {k: tuple(v.shape) for k, v in space.spaces.items()},
                                         self.meta["action_dim"], cfg.flow.chunk_size, tuple(cfg.flow.obs_keys),
                                         control_mode=cfg.control_mode if not is_adapter_task(cfg.task) else None, task=cfg.task,
                                         max_episodes=cfg.sft.max_episodes)
        self.policy = self.build_policy()
        self.policy.fit_observation_stats(self.demos.obs)
        self.algo = FlowSFT(self.policy, self.demos, cfg.sft, self.device, sync=self.data_parallel)
        self.meta["dataset"] = {"path": str(Path(cfg.dataset).resolve()), "episodes": self.demos.num_episodes,
                                "frames": len(self.demos)}
        if self.is_main:
            console.print(f"SFT on {self.demos.num_episodes} episodes ({len(self.demos)} frames) of {cfg.dataset}")

    @property
    def total_iterations(self) -> int:
        return math.ceil(self.cfg.sft.num_updates / self.cfg.sft.updates_per_iteration)

    @property
    def log_step(self) -> int:
        return self.algo.updates

    @property
    def x_label(self) -> str:
        return "gradient updates"

    def status_line(self, metrics: dict[str, float]) -> str:
        return f"flow-matching loss {metrics['loss/flow_matching']:.4f}  lr {metrics['loss/lr']:.2e}"

    def train_iteration(self) -> dict[str, float]:
        remaining = self.cfg.sft.num_updates - self.algo.updates
        with self.all_cores():  # the simulator is idle
            stats = self.algo.update(min(self.cfg.sft.updates_per_iteration, remaining), self.generator)
        return {f"loss/{k}": v for k, v in stats.items()}
