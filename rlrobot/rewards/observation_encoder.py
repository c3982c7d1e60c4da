"""The observations of the progress models: the encoder (one part per observation key: state, instruction token ids,
camera images; fused into one embedding), shared by the progress head (``progress_model.py``) and the completion model
(``completion.py``), each with its own weights; and the check that a saved model reads the observations an env has."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from rlrobot.envs.language import EMBEDDING_DIM, TOKENS_KEY
from rlrobot.policies.flow import EntityAttention, TokenEncoder

if TYPE_CHECKING:
    from rlrobot.rewards.progress_model import PRMNetConfig


def mlp(in_dim: int, hidden: tuple[int, ...], out_dim: int) -> nn.Sequential:
    """Linear -> LayerNorm -> SiLU per hidden width, then a linear output."""
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [nn.Linear(in_dim, h), nn.LayerNorm(h), nn.SiLU()]
        in_dim = h
    layers.append(nn.Linear(in_dim, out_dim))
    return nn.Sequential(*layers)


class ObservationEncoder(nn.Module):
    """state (normalised with the training data's mean / std, kept in buffers; an MLP, or the flow policy's entity
    attention with ``state_entities``), instruction token ids (the flow policy's ``TokenEncoder``: word order kept,
    which a sentence embedding hardly keeps) and images -> [B, embed_dim]."""

    def __init__(self, obs_space: dict[str, list[int]], cfg: PRMNetConfig):
        super().__init__()
        self.keys = tuple(cfg.obs_keys)
        self.parts = nn.ModuleDict()
        self.entities = None
        for key in self.keys:
            shape = list(obs_space[key])
            if key == "state":
                self.register_buffer("state_mean", torch.zeros(shape[0]))
                self.register_buffer("state_std", torch.ones(shape[0]))
                if cfg.state_entities:
                    length = list(obs_space[TOKENS_KEY])[0] if TOKENS_KEY in obs_space else 0
                    self.entities = EntityAttention(cfg.state_entities, shape[0], EMBEDDING_DIM, cfg.entity_config(),
                                                    length)
                    self.parts[key] = nn.Sequential(nn.SiLU(), nn.Linear(self.entities.out_dim, cfg.embed_dim))
                else:
                    self.parts[key] = mlp(shape[0], cfg.state_hidden, cfg.embed_dim)
            elif key == TOKENS_KEY:
                self.parts[key] = TokenEncoder(cfg.instruction_vocab, shape[0], cfg.embed_dim, "silu")
            else:
                c, h, w = shape
                convs: list[nn.Module] = []
                for out in cfg.conv_channels:
                    convs += [nn.Conv2d(c, out, 3, stride=2, padding=1), nn.SiLU()]
                    c, h, w = out, (h + 1) // 2, (w + 1) // 2
                self.parts[key] = nn.Sequential(*convs, nn.Flatten(), nn.Linear(c * h * w, cfg.embed_dim))
        self.out = nn.Sequential(nn.LayerNorm(cfg.embed_dim * len(self.keys)), nn.Linear(cfg.embed_dim * len(self.keys),
                                                                                         cfg.embed_dim))

    def fit_state_stats(self, states: Tensor) -> None:
        """Normalise the state with the training data's mean and std (kept in buffers, saved with the weights)."""
        if "state" in self.keys:
            self.state_mean.copy_(states.float().mean(0))
            self.state_std.copy_(states.float().std(0).clamp_min(1e-2))  # parked objects never move: std 0

    def forward(self, obs: dict[str, Tensor]) -> Tensor:
        parts = []
        for key in self.keys:
            x = obs[key]
            if key == "state" and self.entities is not None:
                tokens = obs.get(TOKENS_KEY)
                features = self.entities((x.float() - self.state_mean) / self.state_std, None, x.float(), tokens)
                parts.append(self.parts[key](features))
            elif key == "state":
                parts.append(self.parts[key]((x.float() - self.state_mean) / self.state_std))
            elif key == TOKENS_KEY:
                parts.append(self.parts[key](x))
            else:
                parts.append(self.parts[key](x.float() / 255.0 - 0.5))
        return self.out(torch.cat(parts, -1))


def check_observation_space(saved: dict[str, list[int]], current: dict[str, Any], what: str = "the env") -> None:
    """Refuse a PRM trained on another observation space: one line naming the key."""
    for key, shape in saved.items():
        if key not in current:
            raise ValueError(f"PRM observation {key!r} (shape {list(shape)}) is not an observation of {what}; it has "
                             f"{sorted(current)}")
        have = list(getattr(current[key], "shape", current[key]))
        if have != list(shape):
            raise ValueError(f"PRM observation {key!r} has shape {list(shape)} in the checkpoint; {what} has {have}")
