"""Runners of the progress models: ``rlrobot train --algo prm`` (``rlrobot.algorithms.progress_model``) and, on the
same base, ``--algo sarm`` (``rlrobot.runners.sarm``). They load and label the datasets, train the model, checkpoint it
(weights in model.safetensors, ``config.json["prm"]`` for ``load_progress_model``), and evaluate it on held-out
episodes (``rlrobot.data.progress_metrics``; curves under <run>/prm_eval at the end)."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from rlrobot.algorithms.progress_model import PRMConfig, PRMLearner
from rlrobot.checkpoints import load_checkpoint
from rlrobot.config import TrainConfig
from rlrobot.data.progress_labels import ProgressData, load_progress_data, split_holdout, task_instruction_observation
from rlrobot.data.progress_metrics import evaluate_progress_model
from rlrobot.logging.loggers import Logger
from rlrobot.rewards.progress_model import PRMNetConfig, VLACProgressModel, check_observation_space, prm_metadata
from rlrobot.runners.base import Runner, console


class ProgressModelRunner(Runner):
    """What the runs of a progress model share: the labelled datasets (training, held-out, calibration), the
    iteration count from the update budget, held-out evaluation. Subclasses build ``self.policy`` and ``self.algo``
    (whose ``updates`` counts gradient steps) from ``self.data``."""

    section: Any  # the algorithm's section (PRMConfig, SARMConfig): budget, data and evaluation settings

    def load_data(self, obs_keys: tuple[str, ...], shapes: dict[str, tuple[int, ...]], **labels: Any) -> None:
        """``self.data`` (training), ``self.eval_data`` (held out: ``eval_dataset``, else the last
        ``holdout_episodes``) and ``self.calibration_data`` (``calibration_episodes`` per dataset kept out of training
        for the done threshold; None: the training data). Instructions are encoded as the run's task observes them."""
        cfg, section = self.cfg, self.section
        encoder = task_instruction_observation(cfg.task)
        data = load_progress_data(cfg.dataset, obs_keys, shapes, section.min_time_correlation, self.device,
                                  max_episodes=section.max_episodes, filter_failures=section.filter_failures,
                                  instruction_observation=encoder, **labels)
        if section.eval_dataset:
            self.data = data
            self.eval_data = load_progress_data(section.eval_dataset, obs_keys, shapes, section.min_time_correlation,
                                                self.device, instruction_observation=encoder)
        else:
            self.data, self.eval_data = split_holdout(data, section.holdout_episodes)
        self.calibration_data: ProgressData | None = None
        if section.calibration_episodes:  # a validation split of the training data for the done threshold
            dirs = len({row["dataset"] for row in self.data.episode_info})
            self.data, self.calibration_data = split_holdout(self.data, section.calibration_episodes * dirs)
        self.meta["dataset"] = {"path": cfg.dataset, **self.data.info}
        if self.is_main:
            i = self.data.info
            console.print(f"{cfg.algo.upper()} on {i['episodes']} episodes ({i['frames']} frames, {i['successful_episodes']} "
                          f"successful, {i['filtered_episodes']} filtered out of progress by time correlation) of "
                          f"{cfg.dataset}; families {i['families']}", soft_wrap=True)

    @property
    def total_iterations(self) -> int:
        return math.ceil(self.section.num_updates / self.section.updates_per_iteration)

    @property
    def log_step(self) -> int:
        return self.algo.updates

    @property
    def x_label(self) -> str:
        return "gradient updates"

    def updates_this_iteration(self) -> int:
        return min(self.section.updates_per_iteration, self.section.num_updates - self.algo.updates)

    def _periodic_eval(self, logger: Logger) -> dict[str, Any] | None:
        every = self.eval_interval()
        if not every or self.iteration % every or self.iteration >= self.total_iterations:
            return None
        result = self.evaluate(video=False)
        logger.log({f"eval/{k}": v for k, v in result.items() if isinstance(v, float)}, self.log_step)
        return result

    def evaluate(self, video: bool) -> dict[str, Any]:
        """The progress metrics on the held-out episodes; curves under <run>/prm_eval."""
        if self.eval_data is None:
            return {}
        out = Path(self.out) / "prm_eval" if video else None
        m = evaluate_progress_model(self.policy, self.eval_data, stride=self.section.eval_stride, out=out,
                                    seed=self.cfg.seed)["metrics"]
        console.print(f"{self.cfg.algo.upper()} on {m['episodes']} held-out episodes: Spearman {m['spearman_mean']:.3f} "
                      f"(success {m['spearman_success']:.3f}, failed {m['spearman_failed']:.3f}, anchored "
                      f"{m['spearman_anchored']:.3f}), done F1 {m['done_f1']:.3f}, reversed total "
                      f"{m['reversed_total_mean']:.3f}, mismatch ratio {m['mismatch_ratio']:.3f}", soft_wrap=True)
        return m


class PRMRunner(ProgressModelRunner):
    """Trains the VLAC-style PRM; checkpoints hold its weights (model.safetensors) and ``config.json["prm"]``."""

    def __init__(self, cfg: TrainConfig):
        super().__init__(cfg)
        self.section: PRMConfig = cfg.prm
        space = self.env.single_observation_space
        net: PRMNetConfig = cfg.prm_net
        missing = [k for k in net.obs_keys if k not in space.spaces]
        if missing:
            raise ValueError(f"prm_net.obs_keys: {missing[0]!r} is not an observation of task {cfg.task!r} with "
                             f"obs_mode={cfg.obs_mode!r}; it has {sorted(space.spaces)}")
        net = net.for_observation_space(space)
        shapes = {k: tuple(space[k].shape) for k in net.obs_keys}
        self.load_data(tuple(net.obs_keys), shapes, exclude_families=self.section.exclude_families,
                       success_labels=self.section.success_labels, after_success=self.section.after_success)
        self.policy = VLACProgressModel({k: list(v) for k, v in shapes.items()}, net).to(self.device)
        if "state" in net.obs_keys:
            self.policy.fit_state_stats(self.data.obs["state"])
        if self.section.init:
            self._warm_start(self.section.init)
        self.algo = PRMLearner(self.policy, self.data, self.section, self.device, calibration_data=self.calibration_data)
        self.meta["prm"] = prm_metadata(self.policy)

    def _warm_start(self, path: str) -> None:
        """Weights (and state statistics) of another PRM run; only heads this net adds may be missing from it."""
        weights, config, ckpt = load_checkpoint(path)
        if not config.get("prm"):
            raise ValueError(f"prm.init: {ckpt} is not a process-reward-model checkpoint (no 'prm' entry in config.json)")
        check_observation_space(config["prm"]["observation_space"], self.policy.observation_space, "this run")
        head = config["prm"].get("net", {}).get("progress_head", "pair")
        if head != self.policy.cfg.progress_head:
            raise ValueError(f"prm.init: {ckpt} has prm_net.progress_head {head!r}, this run "
                             f"{self.policy.cfg.progress_head!r}; warm starts keep the head")
        mine = self.policy.state_dict()
        bad = [k for k, v in weights.items() if k not in mine or mine[k].shape != v.shape]
        if bad:
            raise ValueError(f"prm.init: {ckpt} has another network ({bad[0]!r} differs); use the same --prm-net widths")
        missing = self.policy.load_state_dict(weights, strict=False).missing_keys
        if self.is_main:
            console.print(f"PRM warm start from {ckpt}" + (f"; fresh: {sorted({k.split('.')[0] for k in missing})}"
                                                           if missing else ""), soft_wrap=True)

    def status_line(self, metrics: dict[str, float]) -> str:
        return (f"delta mse {metrics.get('loss/delta_mse', 0):.4f}  done bce {metrics.get('loss/done_bce', 0):.4f}  "
                f"{metrics.get('perf/updates_per_s', 0):.0f} updates/s")

    def train_iteration(self) -> dict[str, float]:
        n = self.updates_this_iteration()
        start = time.perf_counter()
        with self.all_cores():
            stats = self.algo.update(n, self.generator)
        out = {f"loss/{k}": v for k, v in stats.items()}
        if self.algo.updates >= self.section.num_updates:  # the last iteration: the done threshold the checkpoint keeps
            calibration = self.algo.calibrate_done_threshold(seed=self.cfg.seed)
            self.meta["prm"]["net"]["done_threshold"] = calibration["done_threshold"]
            out.update({f"done/{k}": v for k, v in calibration.items()})
        out["perf/updates_per_s"] = n / max(time.perf_counter() - start, 1e-9)
        return out
