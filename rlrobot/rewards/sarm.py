"""LeRobot's SARM (stage-aware reward model, arXiv 2509.25358) behind ``ProgressRewardModel`` (issue 20 item 5): a
second implementation to compare with the VLAC-style PRM (``rlrobot.rewards.prm``). Needs the ``vla`` extra
(lerobot 0.6.1, Python >= 3.12); built offline from local paths only (no hub ids, tiny random weights trained here).

What is LeRobot's (``lerobot.rewards.sarm``): ``SARMConfig`` / ``SARMRewardModel`` -- a causal StageTransformer
(stage logits) and a SubtaskTransformer (within-stage progress tau, conditioned on a one-hot stage, 75 % teacher
forcing) over per-frame tokens of a visual feature, the language embedding and the state; its loss (``forward``: stage
cross-entropy + tau MSE on ``stage.tau`` targets of every frame of a window) and ``normalize_stage_tau``.

What is ours (the part LeRobot's processor does with CLIP features and annotated subtask frames):
- inputs: the state (normalised with the training data's mean / std, as SARM's MEAN_STD state normalisation), the
  instruction's cached all-MiniLM-L6-v2 embedding (384-d, SARM's ``text_dim``); state-only tasks have no camera, so
  the visual stream gets a constant zero feature (``image_dim`` 1) and the state stream carries the observation;
- annotation mode ``single_stage`` (one stage: the datasets record no subtask boundaries) with our progress labels
  (``rlrobot.data.progress_labels``: time progress to the first success, the task's progress for failures) as tau,
  the same labels the VLAC-style model learns, so the two compare on equal data;
- windows: ``n_obs_steps + 1`` frames ``frame_gap`` apart ending at the sampled frame (clamped to the episode's start;
  LeRobot centres its window on the sampled frame and reads the last position, i.e. the same causal window), SARM's
  rewind augmentation (with ``rewind_probability``, 1..``max_rewind_steps`` earlier frames appended in reverse order
  with their lower progress) and language perturbation (another instruction of the data, targets 0) per sample;
- the protocol: ``progress(obs_before, obs_after, instruction)`` runs SARM on the two-frame sequence (before, after)
  and returns VLAC's relative delta of its two progress values (so the VLAC value update rebuilds SARM's progress) and
  the after frame's progress as the done probability (SARM has no done head; the threshold is the best F1 on
  calibration episodes kept out of training).

``python -m rlrobot.rewards.sarm --dataset DIR[,DIR...] --eval-dataset DIR[,DIR...] --out DIR`` trains, saves
(``save_sarm`` / ``load_sarm``) and evaluates it with ``rlrobot prm-eval``'s metrics (``evaluate_prm``).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from rlrobot.rewards.prm import EMBEDDING_DIM, check_observation_space, relative_delta

ADAPTER_FILE = "rlrobot_sarm.json"


def _lerobot_sarm():
    try:
        from lerobot.rewards.sarm.configuration_sarm import SARMConfig
        from lerobot.rewards.sarm.modeling_sarm import SARMRewardModel
        from lerobot.rewards.sarm.sarm_utils import normalize_stage_tau
    except ImportError as err:  # lerobot is the vla extra (Python >= 3.12)
        raise ImportError(f"the SARM adapter needs LeRobot 0.6.1: pip install -e '.[vla]' (Python >= 3.12) ({err})") from err
    return SARMConfig, SARMRewardModel, normalize_stage_tau


@dataclass
class SARMAdapterConfig:
    """The SARM network (LeRobot's SARMConfig fields, sized for CPU) and its training on our datasets."""

    hidden_dim: int = 64
    """SARMConfig.hidden_dim (LeRobot's default 768)"""
    num_layers: int = 2
    """SARMConfig.num_layers, of each of the two transformers (default 8)"""
    num_heads: int = 2
    """SARMConfig.num_heads (default 12)"""
    dropout: float = 0.1
    n_obs_steps: int = 4
    """frames in a window besides the target frame"""
    frame_gap: int = 5
    """frames between window frames (LeRobot's default 30 is one second at 30 fps; our suite runs 100-150-frame episodes)"""
    max_rewind_steps: int = 2
    rewind_probability: float = 0.8
    language_perturbation_probability: float = 0.2
    num_updates: int = 3000
    batch_size: int = 64
    lr: float = 5e-4
    """peak AdamW learning rate (cosine to 10 %); LeRobot's preset 5e-5 is for fine-tuning its 768-wide model"""
    weight_decay: float = 1e-3
    calibration_episodes: int = 4
    """episodes per dataset directory kept out of training to choose the done threshold on"""
    seed: int = 0

    def validate(self) -> None:
        for name in ("hidden_dim", "num_layers", "num_heads", "n_obs_steps", "frame_gap", "num_updates", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"sarm.{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden_dim % self.num_heads:
            raise ValueError(f"sarm.hidden_dim ({self.hidden_dim}) must be a multiple of sarm.num_heads ({self.num_heads})")
        if not 0 <= self.max_rewind_steps < self.n_obs_steps:
            raise ValueError(f"sarm.max_rewind_steps must be in [0, n_obs_steps), got {self.max_rewind_steps}")
        for name in ("rewind_probability", "language_perturbation_probability", "dropout"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"sarm.{name} must be in [0, 1], got {getattr(self, name)}")
        if self.lr <= 0 or self.weight_decay < 0 or self.calibration_episodes < 0:
            raise ValueError("sarm.lr must be > 0, sarm.weight_decay and sarm.calibration_episodes >= 0")


def build_sarm(state_dim: int, cfg: SARMAdapterConfig, device: str | torch.device = "cpu"):
    """LeRobot's SARMRewardModel with fresh random weights, offline (no pretrained path, no image key)."""
    SARMConfig, SARMRewardModel, _ = _lerobot_sarm()  # noqa: N806
    config = SARMConfig(annotation_mode="single_stage", n_obs_steps=cfg.n_obs_steps, frame_gap=cfg.frame_gap,
                        max_rewind_steps=cfg.max_rewind_steps, image_dim=1, text_dim=EMBEDDING_DIM,
                        hidden_dim=cfg.hidden_dim, num_heads=cfg.num_heads, num_layers=cfg.num_layers,
                        max_state_dim=state_dim, dropout=cfg.dropout, rewind_probability=cfg.rewind_probability,
                        language_perturbation_probability=cfg.language_perturbation_probability,
                        device=str(device), image_key="")
    return SARMRewardModel(config)


class SARMProgressModel(nn.Module):
    """``ProgressRewardModel`` around a LeRobot SARMRewardModel (state observations + instruction embedding)."""

    def __init__(self, sarm, state_dim: int, cfg: SARMAdapterConfig, done_threshold: float = 0.9):
        super().__init__()
        self.sarm = sarm
        self.cfg = cfg
        self.obs_keys = ("state",)
        self.observation_space = {"state": [state_dim]}
        self.done_threshold = float(done_threshold)
        self.register_buffer("state_mean", torch.zeros(state_dim))
        self.register_buffer("state_std", torch.ones(state_dim))

    def fit_state_stats(self, states: Tensor) -> None:
        self.state_mean.copy_(states.float().mean(0))
        self.state_std.copy_(states.float().std(0).clamp_min(1e-2))

    def _inputs(self, states: Tensor) -> tuple[Tensor, Tensor]:
        """[B, T, D] raw states -> (zero visual features [B, T, 1], normalised states [B, T, D])."""
        norm = (states.float() - self.state_mean) / self.state_std
        return norm.new_zeros(*norm.shape[:2], 1), norm

    def frame_progress(self, states: Tensor, instruction_embedding: Tensor, lengths: Tensor | None = None) -> Tensor:
        """SARM's normalised progress of every frame of causal sequences ([B, T, D] states, [B, 384]) -> [B, T], as
        ``SARMRewardModel.calculate_rewards`` computes it (stage argmax -> one-hot prior -> tau -> normalize_stage_tau)
        but on the device, as a tensor."""
        _, _, normalize_stage_tau = _lerobot_sarm()
        video, state = self._inputs(states)
        b, t = state.shape[:2]
        lengths = torch.full((b,), t, dtype=torch.long, device=state.device) if lengths is None else lengths
        img = video.unsqueeze(1)
        c = self.sarm.config
        stage_logits = self.sarm.stage_model(img, instruction_embedding.float(), state, lengths, scheme="sparse")
        stage_idx = stage_logits.argmax(-1)
        prior = nn.functional.one_hot(stage_idx, num_classes=c.num_sparse_stages).float().unsqueeze(1)
        tau = self.sarm.subtask_model(img, instruction_embedding.float(), state, lengths, prior, scheme="sparse")
        return normalize_stage_tau(stage_idx.float() + tau, num_stages=c.num_sparse_stages,
                                   temporal_proportions=c.sparse_temporal_proportions,
                                   subtask_names=c.sparse_subtask_names)

    @torch.no_grad()
    def progress(self, obs_before: dict[str, Tensor], obs_after: dict[str, Tensor], instruction_embedding: Tensor
                 ) -> tuple[Tensor, Tensor]:
        p = self.frame_progress(torch.stack([obs_before["state"], obs_after["state"]], 1), instruction_embedding)
        return relative_delta(p[:, 0], p[:, 1]), p[:, 1]

    def forward(self, obs_before: dict[str, Tensor], obs_after: dict[str, Tensor], instruction_embedding: Tensor
                ) -> tuple[Tensor, Tensor]:
        return self.progress(obs_before, obs_after, instruction_embedding)


# ---------------------------------------------------------------------------------------------- training data
def sarm_batch(data, cfg: SARMAdapterConfig, generator: torch.Generator, candidates: Tensor) -> dict[str, Tensor]:
    """One SARM training batch from a ``ProgressData``: windows ending at frames of ``candidates`` (+ rewind frames),
    ``sparse_targets`` = stage 0 + tau (tau = our progress label, < 1 as LeRobot clamps it), ``lengths``, language
    perturbation per sample. State features are raw (the adapter normalises)."""
    from rlrobot.data.progress_labels import other_instruction

    dev = data.device
    b, n, r_max = cfg.batch_size, cfg.n_obs_steps, cfg.max_rewind_steps
    j = candidates[torch.randint(len(candidates), (b,), generator=generator, device=dev)]
    first = data.episode_start[j]
    offsets = torch.arange(n, -1, -1, device=dev) * cfg.frame_gap  # n*gap ... 0: oldest first, the target frame last
    window = torch.maximum(first[:, None], j[:, None] - offsets[None, :])  # [B, n + 1]
    earliest = j - n * cfg.frame_gap
    available = ((earliest - first) // cfg.frame_gap).clamp(0, r_max)  # rewind frames that exist before the window
    rewind = torch.randint(1, r_max + 1, (b,), generator=generator, device=dev) if r_max else torch.zeros_like(j)
    use = torch.rand(b, generator=generator, device=dev) < cfg.rewind_probability
    rewind = torch.where(use, torch.minimum(rewind, available), torch.zeros_like(rewind))
    back = torch.arange(1, r_max + 1, device=dev) * cfg.frame_gap
    rewind_idx = torch.maximum(first[:, None], earliest[:, None] - back[None, :])  # [B, r_max] going back in time
    idx = torch.cat([window, rewind_idx], 1)
    lengths = n + 1 + rewind
    valid = torch.arange(idx.shape[1], device=dev)[None, :] < lengths[:, None]
    targets = torch.where(valid, data.progress[idx].clamp(0.0, 0.999), torch.zeros_like(data.progress[idx]))
    ids = data.instruction_id[j]
    perturbed = torch.rand(b, generator=generator, device=dev) < cfg.language_perturbation_probability
    ids = torch.where(perturbed, other_instruction(data, ids, generator), ids)
    targets = torch.where(perturbed[:, None], torch.zeros_like(targets), targets)
    states = data.obs["state"][idx]
    states = torch.where(valid[..., None], states, torch.zeros_like(states))  # LeRobot masks padded frames too
    return {"states": states, "text_features": data.instruction_embeddings[ids], "lengths": lengths,
            "sparse_targets": targets}


def train_sarm(model: SARMProgressModel, data, cfg: SARMAdapterConfig, log_every: int = 100,
               log=print) -> list[dict[str, float]]:
    """AdamW on LeRobot's SARM loss (``SARMRewardModel.forward``: stage CE + tau MSE) over ``sarm_batch`` batches."""
    generator = torch.Generator(device=data.device).manual_seed(cfg.seed)
    random.seed(cfg.seed)  # SARM's 75 % / 25 % ground-truth / predicted stage conditioning draws from ``random``
    candidates = torch.nonzero(data.trains_progress).squeeze(1)
    if len(candidates) == 0:
        raise ValueError("no episode passed the time-correlation filter: nothing to train SARM on")
    params = list(model.sarm.parameters())
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    history: list[dict[str, float]] = []
    model.train()
    totals: dict[str, float] = {}
    for step in range(cfg.num_updates):
        for group in opt.param_groups:
            group["lr"] = cfg.lr * (0.1 + 0.45 * (1.0 + math.cos(math.pi * step / cfg.num_updates)))
        batch = sarm_batch(data, cfg, generator, candidates)
        video, state = model._inputs(batch["states"])
        loss, out = model.sarm.forward({"video_features": video, "text_features": batch["text_features"],
                                        "state_features": state, "lengths": batch["lengths"],
                                        "sparse_targets": batch["sparse_targets"]})
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        for k, v in out.items():
            totals[k] = totals.get(k, 0.0) + float(v)
        if (step + 1) % log_every == 0 or step + 1 == cfg.num_updates:
            row = {"update": step + 1, **{k: v / log_every for k, v in totals.items()}}
            history.append(row)
            totals = {}
            if log:
                log(f"sarm update {step + 1}/{cfg.num_updates}  tau mse {row.get('sparse_subtask_loss', 0):.4f}")
    model.eval()
    return history


@torch.no_grad()
def calibrate_done_threshold(model: SARMProgressModel, data) -> dict[str, float]:
    """The done threshold (on the done probability ``progress(obs, obs)`` gives, as the evaluation reads it) with the
    best F1 against ``data``'s done labels, set on the model."""
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


# ---------------------------------------------------------------------------------------------- saving
def save_sarm(model: SARMProgressModel, out: str | Path) -> Path:
    """LeRobot's ``save_pretrained`` (config.json + model.safetensors) plus ``rlrobot_sarm.json`` (our adapter:
    observation space, state statistics, done threshold, training config)."""
    out = Path(out)
    model.sarm.save_pretrained(out)
    (out / ADAPTER_FILE).write_text(json.dumps({
        "kind": "sarm", "observation_space": model.observation_space, "done_threshold": model.done_threshold,
        "state_mean": model.state_mean.cpu().tolist(), "state_std": model.state_std.cpu().tolist(),
        "adapter": asdict(model.cfg)}, indent=1))
    return out


def load_sarm(path: str | Path, device: str | torch.device = "cpu",
              observation_space: dict[str, Any] | None = None) -> SARMProgressModel:
    """A saved SARM adapter (local directory only), in eval mode; refuses another observation space (ValueError
    naming the key)."""
    _, SARMRewardModel, _ = _lerobot_sarm()  # noqa: N806
    path = Path(path)
    if not (path / ADAPTER_FILE).is_file():
        raise FileNotFoundError(f"{path} is not a SARM adapter directory (no {ADAPTER_FILE}; python -m rlrobot.rewards.sarm)")
    meta = json.loads((path / ADAPTER_FILE).read_text())
    if observation_space is not None:
        check_observation_space(meta["observation_space"], getattr(observation_space, "spaces", observation_space))
    sarm = SARMRewardModel.from_pretrained(str(path), local_files_only=True)
    sarm.config.device = str(device)
    cfg = SARMAdapterConfig(**meta["adapter"])
    model = SARMProgressModel(sarm, meta["observation_space"]["state"][0], cfg, meta["done_threshold"])
    model.state_mean.copy_(torch.tensor(meta["state_mean"]))
    model.state_std.copy_(torch.tensor(meta["state_std"]))
    return model.to(device).eval()


# ---------------------------------------------------------------------------------------------- command
@dataclass
class SARMTrainArgs:
    dataset: str
    """training LeRobotDatasets (DIR[,DIR...] or a folder of them), e.g. rlrobot collect --recipe ..."""
    eval_dataset: str
    """held-out LeRobotDatasets evaluated with rlrobot prm-eval's metrics"""
    out: str
    """directory of the saved model; metrics.json and progress_curves.png under <out>/prm_eval"""
    sarm: SARMAdapterConfig
    state_dim: int = 89
    """the task's state size (so101-suite: 89)"""
    min_time_correlation: float = 0.5
    filter_failures: bool = True
    """as --prm.filter-failures (the same labels as the VLAC-style model)"""
    device: str = "cpu"


def main(args: SARMTrainArgs) -> dict[str, Any]:
    import time

    from rlrobot.algorithms.prm import split_holdout
    from rlrobot.commands.prm_eval import evaluate_prm
    from rlrobot.data.progress_labels import load_progress_data

    args.sarm.validate()
    shapes = {"state": (args.state_dim,)}
    data = load_progress_data(args.dataset, ("state",), shapes, args.min_time_correlation, args.device,
                              filter_failures=args.filter_failures)
    dirs = len({row["dataset"] for row in data.episode_info})
    train, calibration = split_holdout(data, args.sarm.calibration_episodes * dirs)
    torch.manual_seed(args.sarm.seed)
    model = SARMProgressModel(build_sarm(args.state_dim, args.sarm, args.device), args.state_dim, args.sarm).to(args.device)
    model.fit_state_stats(train.obs["state"])
    start = time.perf_counter()
    train_sarm(model, train, args.sarm)
    seconds = time.perf_counter() - start
    calib = calibrate_done_threshold(model, calibration if calibration is not None else train)
    save_sarm(model, args.out)
    test = load_progress_data(args.eval_dataset, ("state",), shapes, args.min_time_correlation, args.device)
    result = evaluate_prm(model, test, out=Path(args.out) / "prm_eval", seed=args.sarm.seed)
    m = result["metrics"]
    print(f"SARM ({args.sarm.num_updates} updates, {seconds:.0f} s, done threshold {calib['done_threshold']}) on "
          f"{m['episodes']} held-out episodes: Spearman {m['spearman_mean']:.3f} (success {m['spearman_success']:.3f}, "
          f"failed {m['spearman_failed']:.3f}), done F1 {m['done_f1']:.3f}, reversed total {m['reversed_total_mean']:.3f}, "
          f"mismatch ratio {m['mismatch_ratio']:.3f}")
    return {"metrics": m, "train_seconds": seconds, **calib}


if __name__ == "__main__":
    import tyro

    main(tyro.cli(SARMTrainArgs))
