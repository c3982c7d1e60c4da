"""``rlrobot train --algo prm``: the VLAC-style process reward model (``rlrobot.rewards.progress_model``) from
LeRobotDatasets of demonstrations and failures (``--dataset DIR[,DIR...]``; labels and pairs:
``rlrobot.data.progress_labels``).

Loss per update: mean squared error of tanh(delta logit) against the pair labels (forward, reversed, repeated,
mismatched pairs in one batch) + binary cross-entropy of the completion model on frames' done pseudo labels (a share
with a mismatched instruction, label 0). AdamW, gradient-norm clip. The env of ``--task`` is built only for its
observation space (the checkpoint records it; ``load_progress_model`` refuses another); evaluation is on held-out
episodes (``--prm.eval-dataset``, else the last ``--prm.holdout-episodes`` of the data) with the metrics of
``rlrobot.data.progress_metrics`` (Spearman of the progress curve, done F1, reversed and mismatched checks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

import torch
from torch import nn

from rlrobot.algorithms.registry import AlgorithmConfig, AlgorithmSpec, register_algorithm
from rlrobot.algorithms.sft import DatasetInput
from rlrobot.data.progress_labels import (
    AFTER_SUCCESS,
    FORWARD,
    MISMATCHED,
    REVERSED,
    SUCCESS_LABELS,
    PairBatch,
    ProgressData,
    sample_pairs,
)
from rlrobot.domains import Domain, NonNegative, NonNegativeInt, Positive, PositiveInt, UnitInterval
from rlrobot.policies.registry import PolicySpec, register_policy
from rlrobot.rewards.progress_model import PRMNetConfig, VLACProgressModel
from rlrobot.tasks.registry import is_adapter_task, task_spec


@dataclass
class PRMConfig(AlgorithmConfig):
    budget_field: ClassVar[str | None] = "num_updates"

    num_updates: PositiveInt = 4000
    """gradient steps"""
    batch_size: PositiveInt = 256
    """pairs (and as many frames for the completion loss) per update"""
    lr: Positive = 1e-3
    """peak learning rate (AdamW; cosine decay to 10 %)"""
    weight_decay: NonNegative = 1e-4
    """AdamW weight decay"""
    max_grad_norm: Positive = 1.0
    """global gradient-norm clip"""
    max_skip: PositiveInt = 40
    """pairs (i, j) are at most this many frames apart (besides the anchored ones)"""
    anchor_share: UnitInterval = 0.2
    """share of pairs starting at their episode's first frame (long-range deltas)"""
    reversed_share: UnitInterval = 0.25
    """share of pairs reversed (j -> i: negative delta)"""
    repeated_share: UnitInterval = 0.1
    """share of pairs of one frame twice (delta 0)"""
    mismatched_share: UnitInterval = 0.2
    """share of pairs (and done frames) shown another instruction of the data (delta 0, done 0)"""
    hard_mismatch_share: UnitInterval = 0.0
    """share of the pairs' mismatched instructions drawn from the same suite family (hard negatives), the rest uniform"""
    done_mismatched_share: Annotated[float, Domain(-1.0, 1.0)] = -1.0
    """share of the completion loss's frames shown another instruction (done 0); -1 = prm.mismatched_share"""
    done_weight: NonNegative = 0.5
    """weight of the completion model's loss"""
    done_positive_share: UnitInterval = 0.0
    """share of the completion loss's frames drawn from done frames (0 = uniform over frames)"""
    match_weight: NonNegative = 0.5
    """weight of the match head's loss (--prm-net.match-gate)"""
    rank_weight: NonNegative = 0.0
    """weight of a pairwise ranking loss on the forward and reversed pairs (RankNet: logistic loss on the sign of the
    pair's true progress change, of its delta logit / prm.rank_temperature); 0 = off. The delta's squared error
    hardly weighs the order of two frames whose progress differs by a few hundredths; Spearman is that order"""
    rank_temperature: Positive = 0.02
    """the delta logit's scale in the ranking loss (a logit of this size is a confident order)"""
    rank_margin: NonNegative = 0.005
    """pairs whose true delta is at most this are left out of the ranking loss (ties, label noise)"""
    rank_mismatched_ties: bool = False
    """the mismatched pairs join the ranking loss as ties (RankNet's target 1/2: no order under another instruction),
    so the loss that sharpens the order of the matched pairs sharpens the mismatched ones' zero too"""
    min_time_correlation: Annotated[float, Domain(-1.0, 1.0)] = 0.5
    """VLAC's filter: an episode trains progress only if Spearman(labels, time) >= this"""
    filter_failures: bool = True
    """apply the time-correlation filter to failed episodes too (False: successes only; a failure's labels are the
    task's measured progress, and the ones that rise and fall teach regressions)"""
    success_labels: Literal["time", "dense"] = "time"
    """training labels of successful episodes: VLAC's time progress i / T, or the task's dense progress relative to the
    first frame as for failures (one state function for both; held-out evaluation stays on time labels)"""
    after_success: Literal["hold", "track"] = "hold"
    """training labels after a successful episode's first done frame: hold (1 on every later frame, VLAC: a
    demonstration ends at success) | track (1 while the task stays done, the task's dense progress where it is lost
    again, e.g. a cube dropped after the lift; held-out evaluation stays on hold)"""
    calibration_episodes: NonNegativeInt = 0
    """episodes per dataset directory kept out of training to choose the done threshold on (0 = training frames)"""
    exclude_families: tuple[str, ...] = ()
    """suite families whose datasets are left out of training (the held-out-family test), e.g. stack"""
    eval_dataset: str = ""
    """held-out LeRobotDataset(s) (DIR[,DIR...]) evaluated at the end ('' = the last --prm.holdout-episodes of the data)"""
    holdout_episodes: NonNegativeInt = 16
    """episodes kept out of training for evaluation when no --prm.eval-dataset is given (0 = none)"""
    eval_stride: PositiveInt = 5
    """frames between the pairs of the evaluation's progress curves"""
    max_episodes: NonNegativeInt = 0
    """use only the first N episodes of the data (0 = all)"""
    init: str = ""
    """warm start: a PRM run / checkpoint (rlrobot train --algo prm) of the same observation space and widths whose
    weights start this run (a head it lacks, e.g. --prm-net.match-gate's, starts fresh); '' = random"""
    updates_per_iteration: PositiveInt = 100
    """gradient steps between log lines (one runner iteration)"""

    def validate(self, run) -> None:
        for name in ("num_updates", "batch_size", "max_skip", "updates_per_iteration", "eval_stride"):
            if getattr(self, name) < 1:
                raise ValueError(f"prm.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("holdout_episodes", "max_episodes", "calibration_episodes"):
            if getattr(self, name) < 0:
                raise ValueError(f"prm.{name} must be >= 0, got {getattr(self, name)}")
        if self.lr <= 0 or self.weight_decay < 0 or self.max_grad_norm <= 0 or self.done_weight < 0 or self.match_weight < 0:
            raise ValueError("prm.lr and prm.max_grad_norm must be > 0, prm.weight_decay, prm.done_weight and "
                             "prm.match_weight >= 0")
        for name in ("rank_weight", "rank_margin"):
            if getattr(self, name) < 0:
                raise ValueError(f"prm.{name} must be >= 0, got {getattr(self, name)}")
        if self.rank_temperature <= 0:
            raise ValueError(f"prm.rank_temperature must be > 0, got {self.rank_temperature}")
        if self.done_mismatched_share != -1.0 and not 0.0 <= self.done_mismatched_share <= 1.0:
            raise ValueError(f"prm.done_mismatched_share must be in [0, 1] or -1, got {self.done_mismatched_share}")
        for name in ("hard_mismatch_share", "done_positive_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"prm.{name} must be in [0, 1], got {getattr(self, name)}")
        shares = (self.anchor_share, self.reversed_share, self.repeated_share, self.mismatched_share)
        if any(not 0.0 <= s <= 1.0 for s in shares) or sum(shares[1:]) >= 1.0:
            raise ValueError(f"prm.*_share must be in [0, 1] and reversed + repeated + mismatched < 1, got {shares}")
        if self.success_labels not in SUCCESS_LABELS:
            raise ValueError(f"prm.success_labels={self.success_labels!r} is not one of {SUCCESS_LABELS}")
        if self.after_success not in AFTER_SUCCESS:
            raise ValueError(f"prm.after_success={self.after_success!r} is not one of {AFTER_SUCCESS}")
        if not -1.0 <= self.min_time_correlation <= 1.0:
            raise ValueError(f"prm.min_time_correlation must be in [-1, 1], got {self.min_time_correlation}")
        families = () if is_adapter_task(run.task) else getattr(task_spec(run.task).entry_point, "family_names", ())
        bad = [f for f in self.exclude_families if f not in families]
        if bad:
            raise ValueError(f"prm.exclude_families: {bad[0]!r} is not one of task {run.task!r}'s families {families}")
        if not getattr(run, "dataset", ""):
            raise ValueError("dataset: algo='prm' trains from LeRobotDatasets (--dataset DIR[,DIR...])")

    def env_steps_per_iteration(self, run) -> int:
        return 0

    @property
    def discount(self) -> float | None:
        return None


class PRMLearner:
    """Owns the model's optimizer and the update counter (``state_dict`` for --resume)."""

    def __init__(self, model: VLACProgressModel, data: ProgressData, cfg: PRMConfig, device: torch.device,
                 calibration_data: ProgressData | None = None):
        self.model, self.data, self.cfg, self.device = model, data, cfg, device
        self.calibration_data = calibration_data  # episodes kept out of training for the done threshold (None: training)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.updates = 0
        self.candidates = torch.nonzero(data.trains_progress).squeeze(1)
        self.positives = torch.nonzero(data.done).squeeze(1)

    def lr(self) -> float:
        frac = min(self.updates / max(self.cfg.num_updates, 1), 1.0)
        return self.cfg.lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * frac)))

    def losses(self, batch: PairBatch) -> dict[str, torch.Tensor]:
        logit, match = self.model.pair_outputs(batch.before, batch.after, batch.embedding)
        delta = self.model.squash_delta(logit, match)
        done_logit = self.model.done_logits(batch.done_obs, batch.done_embedding)
        out = {"delta_mse": (delta - batch.delta).pow(2).mean(),
               "done_bce": nn.functional.binary_cross_entropy_with_logits(done_logit, batch.done)}
        if match is not None:  # the gate's own target: does the instruction belong to this pair's episode?
            out["match_bce"] = nn.functional.binary_cross_entropy_with_logits(match, (batch.kind != MISMATCHED).float())
        if self.cfg.rank_weight > 0:  # the order of the pair's two frames (both heads' logits rise with the delta)
            ordered = ((batch.kind == FORWARD) | (batch.kind == REVERSED)) & (batch.delta.abs() > self.cfg.rank_margin)
            target = (batch.delta > 0).float()
            if self.cfg.rank_mismatched_ties:
                tie = batch.kind == MISMATCHED
                ordered, target = ordered | tie, torch.where(tie, torch.full_like(target, 0.5), target)
            bce = nn.functional.binary_cross_entropy_with_logits(logit / self.cfg.rank_temperature, target, reduction="none")
            out["rank_bce"] = (bce * ordered).sum() / ordered.sum().clamp_min(1)  # mean over the ranked pairs, no host sync
        return out

    def update(self, n: int, generator: torch.Generator) -> dict[str, float]:
        cfg = self.cfg
        totals: dict[str, float] = {}
        self.model.train()
        for _ in range(n):
            batch = sample_pairs(self.data, cfg.batch_size, generator, cfg.max_skip, cfg.anchor_share, cfg.reversed_share,
                                 cfg.repeated_share, cfg.mismatched_share, candidates=self.candidates,
                                 hard_mismatch_share=cfg.hard_mismatch_share, done_positive_share=cfg.done_positive_share,
                                 positives=self.positives,
                                 done_mismatched_share=None if cfg.done_mismatched_share < 0 else cfg.done_mismatched_share)
            losses = self.losses(batch)
            loss = (losses["delta_mse"] + cfg.done_weight * losses["done_bce"] + cfg.match_weight * losses.get("match_bce", 0.0)
                    + cfg.rank_weight * losses.get("rank_bce", 0.0))
            for group in self.optimizer.param_groups:
                group["lr"] = self.lr()
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
            self.optimizer.step()
            self.updates += 1
            for k, v in losses.items():
                totals[k] = totals.get(k, 0.0) + float(v.detach())
        self.model.eval()
        return {**{k: v / max(n, 1) for k, v in totals.items()}, "lr": self.lr()}

    @torch.no_grad()
    def calibrate_done_threshold(self, max_frames: int = 20_000, seed: int = 0) -> dict[str, float]:
        """The done threshold with the best F1 on (up to ``max_frames``) frames of the calibration episodes (else of the
        training data), set on the model (the held-out test data is never looked at)."""
        data = self.calibration_data if self.calibration_data is not None else self.data
        gen = torch.Generator(device=data.device).manual_seed(seed)
        idx = torch.randperm(len(data), generator=gen, device=data.device)[:max_frames]
        probs = torch.cat([torch.sigmoid(self.model.done_logits(data.frames(chunk), data.embedding(chunk)))
                           for chunk in idx.split(4096)])
        labels = data.done[idx]
        best = (-1.0, 0.5)
        for threshold in torch.linspace(0.05, 0.95, 19).tolist():
            pred = probs > threshold
            tp = float((pred & labels).sum())
            f1 = 2 * tp / max(2 * tp + float((pred & ~labels).sum()) + float((~pred & labels).sum()), 1e-9)
            best = max(best, (f1, round(threshold, 2)))
        self.model.done_threshold = best[1]
        self.model.cfg.done_threshold = best[1]
        return {"done_threshold": best[1], "calibration_done_f1": best[0]}

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = int(state["updates"])


def _build_prm(meta: dict[str, Any], net: PRMNetConfig) -> VLACProgressModel:
    return VLACProgressModel(meta["observation_space"], net)


register_policy(PolicySpec("prm", "prm_net", PRMNetConfig, _build_prm))

register_algorithm(AlgorithmSpec(
    "prm", "VLAC-style process reward model (progress delta + done) from demonstrations and failures (--dataset)",
    "prm", PRMConfig, "prm", "rlrobot.runners.progress_model:PRMRunner", run_fields=(DatasetInput,)))
