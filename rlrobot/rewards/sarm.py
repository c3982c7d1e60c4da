"""LeRobot's SARM (stage-aware reward model, arXiv 2509.25358) behind ``ProgressRewardModel``: a second
implementation to compare with the VLAC-style PRM (``progress_model.py``). Needs the ``vla`` extra (lerobot 0.6.1,
Python >= 3.12); built offline from local paths only (no hub ids, tiny random weights trained by
``rlrobot train --algo sarm``, ``rlrobot.algorithms.sarm``).

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
- the protocol: ``progress(obs_before, obs_after, instruction)`` runs SARM on the two-frame sequence (before, after)
  and returns VLAC's relative delta of its two progress values (so the VLAC value update rebuilds SARM's progress) and
  the after frame's progress as the done probability (SARM has no done head; the threshold is the best F1 on
  calibration episodes kept out of training).

A run's checkpoint holds the model's weights and ``config.json["prm"]`` (``sarm_metadata``); a SARM adapter directory
(LeRobot's ``save_pretrained`` plus ``rlrobot_sarm.json``: ``save_sarm`` / ``load_sarm``) holds the same model outside
a run.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from rlrobot.data.progress_labels import relative_delta
from rlrobot.domains import NonNegativeInt, PositiveInt, UnitInterval
from rlrobot.envs.language import EMBEDDING_DIM
from rlrobot.rewards.observation_encoder import check_observation_space
from rlrobot.sections import Section

ADAPTER_FILE = "rlrobot_sarm.json"


def _lerobot_sarm():
    try:  # lerobot is an optional dependency (the vla extra, Python >= 3.12): imported only where SARM is built
        from lerobot.rewards.sarm.configuration_sarm import SARMConfig
        from lerobot.rewards.sarm.modeling_sarm import SARMRewardModel
        from lerobot.rewards.sarm.sarm_utils import normalize_stage_tau
    except ImportError as err:
        raise ImportError(f"the SARM adapter needs LeRobot 0.6.1: pip install -e '.[vla]' (Python >= 3.12) ({err})") from err
    return SARMConfig, SARMRewardModel, normalize_stage_tau


@dataclass
class SARMNetConfig(Section):
    """The SARM network (``--sarm-net.*``: LeRobot's SARMConfig fields, sized for CPU) and its windows."""

    hidden_dim: PositiveInt = 64
    """SARMConfig.hidden_dim (LeRobot's default 768)"""
    num_layers: PositiveInt = 2
    """SARMConfig.num_layers, of each of the two transformers (default 8)"""
    num_heads: PositiveInt = 2
    """SARMConfig.num_heads (default 12)"""
    dropout: UnitInterval = 0.1
    """SARMConfig.dropout"""
    n_obs_steps: PositiveInt = 4
    """frames in a window besides the target frame"""
    frame_gap: PositiveInt = 5
    """frames between window frames (LeRobot's default 30 is one second at 30 fps; our suite runs 100-150-frame episodes)"""
    max_rewind_steps: NonNegativeInt = 2
    """SARM's rewind augmentation: up to this many earlier frames appended in reverse order (< n_obs_steps)"""
    rewind_probability: UnitInterval = 0.8
    """share of training windows with rewind frames"""
    language_perturbation_probability: UnitInterval = 0.2
    """share of training windows shown another instruction of the data (targets 0)"""

    def validate(self, run: Any = None) -> None:
        if self.hidden_dim % self.num_heads:
            raise ValueError(f"sarm_net.hidden_dim ({self.hidden_dim}) must be a multiple of sarm_net.num_heads "
                             f"({self.num_heads})")
        if not 0 <= self.max_rewind_steps < self.n_obs_steps:
            raise ValueError(f"sarm_net.max_rewind_steps must be in [0, n_obs_steps), got {self.max_rewind_steps}")
        for name in ("hidden_dim", "num_layers", "num_heads", "n_obs_steps", "frame_gap"):
            if getattr(self, name) < 1:
                raise ValueError(f"sarm_net.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("rewind_probability", "language_perturbation_probability", "dropout"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"sarm_net.{name} must be in [0, 1], got {getattr(self, name)}")


def build_sarm(state_dim: int, cfg: SARMNetConfig, device: str | torch.device = "cpu"):
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

    def __init__(self, sarm: nn.Module, state_dim: int, cfg: SARMNetConfig, done_threshold: float = 0.9):
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

    def inputs(self, states: Tensor) -> tuple[Tensor, Tensor]:
        """[B, T, D] raw states -> (zero visual features [B, T, 1], normalised states [B, T, D])."""
        norm = (states.float() - self.state_mean) / self.state_std
        return norm.new_zeros(*norm.shape[:2], 1), norm

    def frame_progress(self, states: Tensor, instruction_embedding: Tensor, lengths: Tensor | None = None) -> Tensor:
        """SARM's normalised progress of every frame of causal sequences ([B, T, D] states, [B, 384]) -> [B, T], as
        ``SARMRewardModel.calculate_rewards`` computes it (stage argmax -> one-hot prior -> tau -> normalize_stage_tau)
        but on the device, as a tensor."""
        _, _, normalize_stage_tau = _lerobot_sarm()
        video, state = self.inputs(states)
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


# ---------------------------------------------------------------------------------------------- saving
def sarm_metadata(model: SARMProgressModel) -> dict[str, Any]:
    """What a SARM run's checkpoint records to rebuild and check the model (``config.json["prm"]``)."""
    return {"kind": "sarm", "obs_keys": list(model.obs_keys), "observation_space": model.observation_space,
            "net": asdict(model.cfg), "done_threshold": model.done_threshold}


def sarm_from_checkpoint(meta: dict[str, Any], weights: dict[str, Tensor]) -> SARMProgressModel:
    """The model of a SARM run's checkpoint (``sarm_metadata`` and its weights)."""
    state_dim = meta["observation_space"]["state"][0]
    net = SARMNetConfig(**meta["net"])
    model = SARMProgressModel(build_sarm(state_dim, net), state_dim, net, meta["done_threshold"])
    model.load_state_dict(weights)
    return model


def save_sarm(model: SARMProgressModel, out: str | Path) -> Path:
    """The model as a SARM adapter directory: LeRobot's ``save_pretrained`` (config.json + model.safetensors) plus
    ``rlrobot_sarm.json`` (observation space, state statistics, done threshold, network config)."""
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
        raise FileNotFoundError(f"{path} is not a SARM adapter directory (no {ADAPTER_FILE}; save_sarm writes one)")
    meta = json.loads((path / ADAPTER_FILE).read_text())
    if observation_space is not None:
        check_observation_space(meta["observation_space"], getattr(observation_space, "spaces", observation_space))
    sarm = SARMRewardModel.from_pretrained(str(path), local_files_only=True)
    sarm.config.device = str(device)
    net = {f.name for f in fields(SARMNetConfig)}  # the adapter's record may also hold its training settings
    cfg = SARMNetConfig(**{k: v for k, v in meta["adapter"].items() if k in net})
    model = SARMProgressModel(sarm, meta["observation_space"]["state"][0], cfg, meta["done_threshold"])
    model.state_mean.copy_(torch.tensor(meta["state_mean"]))
    model.state_std.copy_(torch.tensor(meta["state_std"]))
    return model.to(device).eval()


