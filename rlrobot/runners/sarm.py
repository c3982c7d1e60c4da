"""Runner of ``rlrobot train --algo sarm`` (``rlrobot.algorithms.sarm``): the progress-model run
(``ProgressModelRunner``: datasets, held-out evaluation, checkpoints) with LeRobot's SARM as the model."""

from __future__ import annotations

import random
import time

from rlrobot.algorithms.sarm import SARMConfig, SARMLearner
from rlrobot.config import TrainConfig
from rlrobot.rewards.sarm import SARMNetConfig, SARMProgressModel, build_sarm, sarm_metadata
from rlrobot.runners.progress_model import ProgressModelRunner


class SARMRunner(ProgressModelRunner):
    """Trains SARM on the state observation; checkpoints hold its weights and ``config.json["prm"]``."""

    def __init__(self, cfg: TrainConfig):
        super().__init__(cfg)
        self.section: SARMConfig = cfg.sarm
        net: SARMNetConfig = cfg.sarm_net
        state_dim = int(self.env.single_observation_space["state"].shape[0])
        self.load_data(("state",), {"state": (state_dim,)})
        random.seed(cfg.seed)  # SARM's teacher forcing draws from Python's random (the learner's state keeps it)
        self.policy = SARMProgressModel(build_sarm(state_dim, net, self.device), state_dim, net).to(self.device)
        self.policy.fit_state_stats(self.data.obs["state"])
        self.algo = SARMLearner(self.policy, self.data, self.section, calibration_data=self.calibration_data)
        self.meta["prm"] = sarm_metadata(self.policy)

    def status_line(self, metrics: dict[str, float]) -> str:
        return (f"tau mse {metrics.get('loss/sparse_subtask_loss', 0):.4f}  "
                f"{metrics.get('perf/updates_per_s', 0):.0f} updates/s")

    def train_iteration(self) -> dict[str, float]:
        n = self.updates_this_iteration()
        start = time.perf_counter()
        with self.all_cores():
            stats = self.algo.update(n, self.generator)
        out = {f"loss/{k}": v for k, v in stats.items()}
        if self.algo.updates >= self.section.num_updates:  # the last iteration: the done threshold the checkpoint keeps
            calibration = self.algo.calibrate_done_threshold()
            self.meta["prm"]["done_threshold"] = calibration["done_threshold"]
            out.update({f"done/{k}": v for k, v in calibration.items()})
        out["perf/updates_per_s"] = n / max(time.perf_counter() - start, 1e-9)
        return out
