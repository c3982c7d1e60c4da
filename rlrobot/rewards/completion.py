"""A VLA-RL-style completion model: "is the task done?" per frame, from the observation and the instruction.

VLA-RL fine-tunes a VLM as a robotic process reward model on pseudo labels from automatically extracted task
segments. Ours is a small network trained here (``rlrobot train --algo prm`` trains it beside the progress head) on
per-frame pseudo labels from the episodes' automatic segmentation (``rlrobot.data.progress_labels``): a frame is
"done" once the suite's success flag (all subtasks' done flags in order) holds at it; with a mismatched instruction
every frame is "not done". Its probability is the ``done`` of ``VLACProgressModel.progress``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from rlrobot.envs.language import EMBEDDING_DIM
from rlrobot.rewards.observation_encoder import ObservationEncoder, mlp

if TYPE_CHECKING:
    from rlrobot.rewards.progress_model import PRMNetConfig


class CompletionModel(nn.Module):
    """(obs, instruction embedding) -> [B] done logit. Its own encoder (not shared with the progress head: the two
    losses pull the features apart otherwise)."""

    def __init__(self, obs_space: dict[str, list[int]], cfg: PRMNetConfig):
        super().__init__()
        self.encoder = ObservationEncoder(obs_space, cfg)
        self.text = nn.Sequential(nn.Linear(EMBEDDING_DIM, cfg.text_dim), nn.SiLU())
        width = cfg.head_hidden[0]
        self.inp = nn.Linear(cfg.embed_dim + cfg.text_dim, width)
        self.film = nn.Linear(cfg.text_dim, 2 * width)
        self.head = mlp(width, cfg.head_hidden[1:], 1)

    def forward(self, obs: dict[str, Tensor], instruction_embedding: Tensor) -> Tensor:
        t = self.text(instruction_embedding.float())
        h = self.inp(torch.cat([self.encoder(obs), t], -1))
        scale, shift = self.film(t).chunk(2, -1)
        h = nn.functional.silu(nn.functional.layer_norm(h, h.shape[-1:]) * (1.0 + scale) + shift)
        return self.head(h).squeeze(-1)

    @torch.no_grad()
    def done_prob(self, obs: dict[str, Tensor], instruction_embedding: Tensor) -> Tensor:
        return torch.sigmoid(self(obs, instruction_embedding))
