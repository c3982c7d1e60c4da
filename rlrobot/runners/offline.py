"""Offline runner: every registered offline algorithm (BC, IQL, Cal-QL, FQL, RQL, ...) learns from a LeRobotDataset
(``--dataset``) for ``gradient_steps`` updates; the env is only evaluated (deterministic actions), checkpoints and
``--resume`` as for every runner (weights: all the algorithm's networks; trainer state: its optimizers).

With ``--labelled-fraction f < 1`` only the first f of the episodes (at least one) keep their actions: an
inverse-dynamics model trained on them labels the others (``rlrobot.algorithms.inverse_dynamics``), and the algorithm
trains on the union (semi-supervised offline RL).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rlrobot.algorithms.inverse_dynamics import label_with_inverse_dynamics
from rlrobot.algorithms.registry import ALGORITHMS
from rlrobot.config import TrainConfig
from rlrobot.data.transitions import Transitions, dataset_meta, load_transitions
from rlrobot.runners.base import Runner, console
from rlrobot.tasks.registry import is_adapter_task

NO_REWARDS = "n/a (no rewards recorded)"
NO_SUCCESS = "n/a (no success recorded)"


def load_offline_data(cfg: TrainConfig, obs_shapes: dict[str, tuple], action_dim: int, device) -> Transitions:
    """The run's dataset as Transitions (with inverse-dynamics labels for the unlabelled episodes if asked)."""
    section = cfg.algorithm
    data = load_transitions(cfg.dataset, obs_keys=("state",), obs_shapes=obs_shapes, action_dim=action_dim,
                            task=cfg.task if not is_adapter_task(cfg.task) else None,
                            control_mode=cfg.control_mode if not is_adapter_task(cfg.task) else None, gamma=section.gamma,
                            device=device, max_episodes=section.max_episodes, max_episode_steps=cfg.episode_steps())
    if not data.has_rewards and cfg.spec.needs_rewards:
        imitation = [s.name for s in ALGORITHMS.specs() if not s.needs_rewards and s.runner == cfg.spec.runner]
        raise ValueError(f"dataset {cfg.dataset} has no 'next.reward' feature (e.g. a deploy recording): algo={cfg.algo!r} "
                         f"needs rewards; imitation ({', '.join(imitation)}) trains without them")
    fraction = getattr(cfg, "labelled_fraction", 1.0)
    if fraction < 1.0:
        data = label_with_inverse_dynamics(data, fraction, steps=cfg.inverse_dynamics_steps, seed=cfg.seed)
    return data


class OfflineRunner(Runner):
    def __init__(self, cfg: TrainConfig):
        super().__init__(cfg)
        space = self.env.single_observation_space
        if "state" not in space.spaces:
            raise ValueError(f"algo={cfg.algo!r} trains on state observations; task {cfg.task!r} has {sorted(space.spaces)}")
        obs_dim = int(space["state"].shape[0])
        action_dim = int(self.meta["action_dim"])
        self.data = load_offline_data(cfg, {"state": tuple(space["state"].shape)}, action_dim, self.device)
        self.algo = cfg.spec.learner(cfg.algorithm, obs_dim, action_dim, self.data, self.device, self.generator)
        policy_cfg = cfg.policy_config
        if self.algo.chunk_size > 1 and policy_cfg.execute_steps:
            self.algo.policy.execute_steps = min(policy_cfg.execute_steps, self.algo.chunk_size)
        self.policy = self.algo.policy
        stats = self.data.episode_stats()
        recorded = dataset_meta(cfg.dataset)[0].get("features", {})
        if "next.success" not in recorded:
            stats["success_rate"] = None
        if not self.data.has_rewards:
            stats["return_mean"] = None
        self.meta["dataset"] = {"path": str(Path(cfg.dataset).resolve()), **stats,
                                **{k: v for k, v in self.data.info.items()
                                   if k in ("recipe", "timeouts_without_next_obs", "labelled_fraction", "labelled_episodes",
                                            "inverse_dynamics")}}
        if self.is_main:
            console.print(f"{cfg.algo} on {stats['episodes']} episodes ({stats['transitions']} transitions) of "
                          f"{cfg.dataset}: dataset success {_figure(stats['success_rate'], NO_SUCCESS)}, "
                          f"return {_figure(stats['return_mean'], NO_REWARDS)}"
                          f"{self.data.bootstrap_note()}",
                          soft_wrap=True)

    @property
    def total_iterations(self) -> int:
        section = self.cfg.algorithm
        return math.ceil(section.gradient_steps / section.updates_per_iteration)

    @property
    def log_step(self) -> int:
        return self.algo.updates

    @property
    def x_label(self) -> str:
        return "gradient steps"

    def status_line(self, metrics: dict[str, float]) -> str:
        losses = "  ".join(f"{k.removeprefix('loss/')} {v:.3g}" for k, v in metrics.items() if k.startswith("loss/"))
        return f"{metrics.get('perf/gradient_steps_per_s', 0):,.0f} grad steps/s  {losses}"

    def train_iteration(self) -> dict[str, float]:
        import time

        section = self.cfg.algorithm
        n = min(section.updates_per_iteration, section.gradient_steps - self.algo.updates)
        totals: dict[str, float] = {}
        start = time.perf_counter()
        self.algo.train(True)
        with self.all_cores():  # the simulator is idle
            for _ in range(n):
                for k, v in self.algo.update().items():
                    totals[k] = totals.get(k, 0.0) + v
        self.algo.train(False)
        elapsed = time.perf_counter() - start
        out: dict[str, Any] = {f"loss/{k}": v / max(n, 1) for k, v in totals.items()}
        out["perf/gradient_steps_per_s"] = n / max(elapsed, 1e-9)
        out.update({f"workflow/{k}": v for k, v in self.algo.workflow_metrics().items()})  # rlrobot offline-check
        return out


def _figure(value: float | None, missing: str) -> str:
    return missing if value is None else f"{value:.2f}"
