"""``rlrobot train --algo sarm``: LeRobot's SARM (``rlrobot.rewards.sarm``) trained on the progress labels of
``rlrobot.data.progress_labels``, the labels the VLAC-style PRM (``--algo prm``) learns, so the two compare on equal
data. Needs the ``vla`` extra (lerobot 0.6.1, Python >= 3.12).

Loss per update: LeRobot's own (``SARMRewardModel.forward``: stage cross-entropy + tau MSE) on windows of
``n_obs_steps + 1`` frames ``frame_gap`` apart ending at a sampled frame (clamped to the episode's start; LeRobot
centres its window on the sampled frame and reads the last position, i.e. the same causal window), with SARM's rewind
augmentation (1..``max_rewind_steps`` earlier frames appended in reverse order with their lower progress) and language
perturbation (another instruction of the data, targets 0) per sample. AdamW with a cosine decay to 10 %, gradient-norm
clip 1. The done threshold: the best F1 on calibration episodes kept out of training (``--sarm.calibration-episodes``).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

import torch
from torch import Tensor, nn

from rlrobot.algorithms.registry import AlgorithmConfig, AlgorithmSpec, register_algorithm
from rlrobot.algorithms.sft import DatasetInput
from rlrobot.data.progress_labels import ProgressData, other_instruction
from rlrobot.domains import Domain, NonNegative, NonNegativeInt, Positive, PositiveInt
from rlrobot.policies.registry import PolicySpec, register_policy
from rlrobot.rewards.sarm import SARMNetConfig, SARMProgressModel, build_sarm


@dataclass
class SARMConfig(AlgorithmConfig):
    budget_field: ClassVar[str | None] = "num_updates"

    num_updates: PositiveInt = 3000
    """gradient steps"""
    batch_size: PositiveInt = 64
    """windows per update"""
    lr: Positive = 5e-4
    """peak AdamW learning rate (cosine to 10 %); LeRobot's preset 5e-5 is for fine-tuning its 768-wide model"""
    weight_decay: NonNegative = 1e-3
    """AdamW weight decay"""
    calibration_episodes: NonNegativeInt = 4
    """episodes per dataset directory kept out of training to choose the done threshold on (0 = training frames)"""
    min_time_correlation: Annotated[float, Domain(-1.0, 1.0)] = 0.5
    """VLAC's filter, as --prm.min-time-correlation: an episode trains only if Spearman(labels, time) >= this"""
    filter_failures: bool = True
    """apply the time-correlation filter to failed episodes too (as --prm.filter-failures)"""
    eval_dataset: str = ""
    """held-out LeRobotDataset(s) (DIR[,DIR...]) evaluated at the end ('' = the last --sarm.holdout-episodes of the data)"""
    holdout_episodes: NonNegativeInt = 16
    """episodes kept out of training for evaluation when no --sarm.eval-dataset is given (0 = none)"""
    eval_stride: PositiveInt = 5
    """frames between the pairs of the evaluation's progress curves"""
    max_episodes: NonNegativeInt = 0
    """use only the first N episodes of the data (0 = all)"""
    updates_per_iteration: PositiveInt = 100
    """gradient steps between log lines (one runner iteration)"""

    def validate(self, run: Any) -> None:
        if not getattr(run, "dataset", ""):
            raise ValueError("dataset: algo='sarm' trains from LeRobotDatasets (--dataset DIR[,DIR...])")
        if run.obs_mode != "state":
            raise ValueError(f"algo='sarm' reads the state observation only (its visual stream is a constant); "
                             f"obs_mode={run.obs_mode!r}")

    def env_steps_per_iteration(self, run: Any) -> int:
        return 0

    @property
    def discount(self) -> float | None:
        return None


def sarm_batch(data: ProgressData, net: SARMNetConfig, batch_size: int, generator: torch.Generator,
               candidates: Tensor) -> dict[str, Tensor]:
    """One SARM training batch from a ``ProgressData``: windows ending at frames of ``candidates`` (+ rewind frames),
    ``sparse_targets`` = stage 0 + tau (tau = our progress label, < 1 as LeRobot clamps it), ``lengths``, language
    perturbation per sample. State features are raw (the adapter normalises)."""
    dev = data.device
    b, n, r_max = batch_size, net.n_obs_steps, net.max_rewind_steps
    j = candidates[torch.randint(len(candidates), (b,), generator=generator, device=dev)]
    first = data.episode_start[j]
    offsets = torch.arange(n, -1, -1, device=dev) * net.frame_gap  # n*gap ... 0: oldest first, the target frame last
    window = torch.maximum(first[:, None], j[:, None] - offsets[None, :])  # [B, n + 1]
    earliest = j - n * net.frame_gap
    available = ((earliest - first) // net.frame_gap).clamp(0, r_max)  # rewind frames that exist before the window
    rewind = torch.randint(1, r_max + 1, (b,), generator=generator, device=dev) if r_max else torch.zeros_like(j)
    use = torch.rand(b, generator=generator, device=dev) < net.rewind_probability
    rewind = torch.where(use, torch.minimum(rewind, available), torch.zeros_like(rewind))
    back = torch.arange(1, r_max + 1, device=dev) * net.frame_gap
    rewind_idx = torch.maximum(first[:, None], earliest[:, None] - back[None, :])  # [B, r_max] going back in time
    idx = torch.cat([window, rewind_idx], 1)
    lengths = n + 1 + rewind
    valid = torch.arange(idx.shape[1], device=dev)[None, :] < lengths[:, None]
    targets = torch.where(valid, data.progress[idx].clamp(0.0, 0.999), torch.zeros_like(data.progress[idx]))
    ids = data.instruction_id[j]
    perturbed = torch.rand(b, generator=generator, device=dev) < net.language_perturbation_probability
    ids = torch.where(perturbed, other_instruction(data, ids, generator), ids)
    targets = torch.where(perturbed[:, None], torch.zeros_like(targets), targets)
    states = data.obs["state"][idx]
    states = torch.where(valid[..., None], states, torch.zeros_like(states))  # LeRobot masks padded frames too
    return {"states": states, "text_features": data.instruction_embeddings[ids], "lengths": lengths,
            "sparse_targets": targets}


class SARMLearner:
    """AdamW on LeRobot's SARM loss over ``sarm_batch`` batches; owns the optimizer, the update counter and the state
    of Python's ``random``, which SARM's 75 % / 25 % ground-truth / predicted stage conditioning draws from
    (``state_dict`` for --resume)."""

    def __init__(self, model: SARMProgressModel, data: ProgressData, cfg: SARMConfig,
                 calibration_data: ProgressData | None = None):
        self.model, self.data, self.cfg = model, data, cfg
        self.calibration_data = calibration_data
        self.candidates = torch.nonzero(data.trains_progress).squeeze(1)
        if len(self.candidates) == 0:
            raise ValueError("no episode passed the time-correlation filter: nothing to train SARM on")
        self.params = list(model.sarm.parameters())
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.updates = 0

    def lr(self) -> float:
        return self.cfg.lr * (0.1 + 0.45 * (1.0 + math.cos(math.pi * self.updates / self.cfg.num_updates)))

    def update(self, n: int, generator: torch.Generator) -> dict[str, float]:
        """``n`` gradient steps; the mean of LeRobot's logged losses over them."""
        totals: dict[str, float] = {}
        self.model.train()
        for _ in range(n):
            for group in self.optimizer.param_groups:
                group["lr"] = self.lr()
            batch = sarm_batch(self.data, self.model.cfg, self.cfg.batch_size, generator, self.candidates)
            video, state = self.model.inputs(batch["states"])
            loss, out = self.model.sarm.forward({"video_features": video, "text_features": batch["text_features"],
                                                 "state_features": state, "lengths": batch["lengths"],
                                                 "sparse_targets": batch["sparse_targets"]})
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(self.params, 1.0)
            self.optimizer.step()
            self.updates += 1
            for k, v in out.items():
                totals[k] = totals.get(k, 0.0) + float(v)
        self.model.eval()
        return {**{k: v / max(n, 1) for k, v in totals.items()}, "lr": self.lr()}

    @torch.no_grad()
    def calibrate_done_threshold(self) -> dict[str, float]:
        """The done threshold (on the done probability ``progress(obs, obs)`` gives, as the evaluation reads it) with
        the best F1 against the calibration episodes' done labels (else the training data's), set on the model."""
        data = self.calibration_data if self.calibration_data is not None else self.data
        model = self.model
        probs = torch.cat([model.progress(data.frames(c), data.frames(c), data.embedding(c))[1]
                           for c in torch.arange(len(data), device=data.device).split(4096)])
        labels = data.done
        best = (-1.0, 0.5)
        for threshold in torch.linspace(0.05, 0.95, 19).tolist():
            pred = probs > threshold
            tp = float((pred & labels).sum())
            f1 = 2 * tp / max(2 * tp + float((pred & ~labels).sum()) + float((~pred & labels).sum()), 1e-9)
            best = max(best, (f1, round(threshold, 2)))
        model.done_threshold = best[1]
        return {"done_threshold": best[1], "calibration_done_f1": best[0]}

    def state_dict(self) -> dict[str, Any]:
        version, internal, gauss = random.getstate()
        return {"optimizer": self.optimizer.state_dict(), "updates": self.updates,
                "random": {"version": version, "internal": list(internal), "gauss": gauss}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = int(state["updates"])
        saved = state["random"]
        random.setstate((saved["version"], tuple(saved["internal"]), saved["gauss"]))


def _build_sarm(meta: dict[str, Any], net: SARMNetConfig) -> SARMProgressModel:
    state_dim = meta["observation_space"]["state"][0]
    return SARMProgressModel(build_sarm(state_dim, net), state_dim, net)


register_policy(PolicySpec("sarm", "sarm_net", SARMNetConfig, _build_sarm))

register_algorithm(AlgorithmSpec(
    "sarm", "LeRobot's SARM stage-aware reward model on the PRM's progress labels (--dataset; the vla extra)",
    "sarm", SARMConfig, "sarm", "rlrobot.runners.sarm:SARMRunner", run_fields=(DatasetInput,)))
