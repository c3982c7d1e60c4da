"""SAC networks: a tanh-squashed Gaussian actor and an ensemble of Q critics evaluated in one batched matmul.

The ensemble (N critics, REDQ-style; N=2 is SAC's twin Q) keeps its weights as ``[N, in, out]`` tensors so that all
critics run as one ``baddbmm`` instead of N small MLPs: on a CPU that is the difference between N kernel launches
per layer and one. Optional LayerNorm per critic (WSRL / RLPD practice). The target critics live in the same module
so that a checkpoint holds everything needed to resume.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from rlrobot.domains import PositiveInt

from .actor_critic import MLP_ACTIVATIONS, ActorCriticConfig, instruction_dim, mlp, with_instruction
from .normalizer import RunningNormalizer
from .registry import PolicySpec, register_policy

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


@dataclass
class SACPolicyConfig(ActorCriticConfig):
    num_critics: PositiveInt = 2
    """critics in the ensemble (2: SAC's twin Q; 10 with sac.num_target_critics 2: REDQ)"""
    critic_layer_norm: bool = False
    """LayerNorm in every critic layer (RLPD / WSRL practice)"""

    def validate(self, run) -> None:
        super().validate(run)
        if self.num_critics < 1:
            raise ValueError(f"policy.num_critics must be >= 1, got {self.num_critics}")
        if self.image_keys:
            raise ValueError(f"policy.image_keys {list(self.image_keys)}: the SAC policy reads vector observations only "
                             "(image actors: --algo ppo)")
        if self.critic_obs_key:
            raise ValueError(f"policy.critic_obs_key={self.critic_obs_key!r}: the SAC policy's critics read the actor's "
                             "input (an asymmetric critic: --algo ppo)")


class EnsembleLinear(nn.Module):
    """N independent linear layers applied to ``[N, B, in]`` in one batched matmul."""

    def __init__(self, num_members: int, in_features: int, out_features: int):
        super().__init__()
        bound = 1.0 / math.sqrt(in_features)  # nn.Linear's default init, per member
        self.weight = nn.Parameter(torch.empty(num_members, in_features, out_features).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(num_members, 1, out_features).uniform_(-bound, bound))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(self.bias, x, self.weight)


class EnsembleLayerNorm(nn.Module):
    def __init__(self, num_members: int, features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(num_members, 1, features))
        self.bias = nn.Parameter(torch.zeros(num_members, 1, features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, x.shape[-1:]) * self.weight + self.bias


class QEnsemble(nn.Module):
    """Q(s, a) for N critics at once: returns ``[N, B]``."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: tuple[int, ...], num_critics: int,
                 activation: str = "relu", layer_norm: bool = False):
        super().__init__()
        self.num_critics = num_critics
        layers: list[nn.Module] = []
        in_dim = obs_dim + action_dim
        for h in hidden:
            layers.append(EnsembleLinear(num_critics, in_dim, h))
            if layer_norm:
                layers.append(EnsembleLayerNorm(num_critics, h))
            layers.append(MLP_ACTIVATIONS[activation]())
            in_dim = h
        layers.append(EnsembleLinear(num_critics, in_dim, 1))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        h = torch.cat([x, action], -1).unsqueeze(0).expand(self.num_critics, -1, -1)
        return self.net(h).squeeze(-1)


class SquashedGaussianActor(nn.Module):
    """a = tanh(u), u ~ N(mu(s), sigma(s)); log-prob with the tanh change-of-variables correction."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: tuple[int, ...], activation: str = "relu"):
        super().__init__()
        self.net = mlp(obs_dim, hidden, 2 * action_dim, activation)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, log_std = self.net(x).chunk(2, dim=-1)
        # squash log-std smoothly into [LOG_STD_MIN, LOG_STD_MAX] (CleanRL / SpinningUp practice)
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (torch.tanh(log_std) + 1.0)
        return mean, log_std

    def sample(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterised sample in (-1, 1) and its log-probability (summed over action dims)."""
        mean, log_std = self(x)
        std = log_std.exp()
        u = mean + std * torch.randn_like(mean)
        log_prob = (-0.5 * ((u - mean) / std).square() - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        # log |d tanh(u)/du| = log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)), stable for large |u|
        log_prob = log_prob - (2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))).sum(-1)
        return torch.tanh(u), log_prob


class SACPolicy(nn.Module):
    """Actor + critic ensemble + target critics, sharing one observation normaliser (off by default for SAC)."""

    def __init__(self, obs_dim: int, action_dim: int, cfg: SACPolicyConfig | None = None, instruction_dim: int = 0):
        super().__init__()
        cfg = cfg or SACPolicyConfig()
        if cfg.num_critics < 1:
            raise ValueError(f"policy.num_critics must be >= 1, got {cfg.num_critics}")
        self.cfg = cfg
        self.obs_dim, self.action_dim = obs_dim, action_dim
        self.instruction_dim = instruction_dim if cfg.instruction_key else 0
        self.normalizer = RunningNormalizer(obs_dim) if cfg.normalize_obs else nn.Identity()
        in_dim = obs_dim + self.instruction_dim  # the instruction embedding is concatenated to the normalised state
        self.actor = SquashedGaussianActor(in_dim, action_dim, cfg.actor_hidden, cfg.activation)
        self.critic = QEnsemble(in_dim, action_dim, cfg.critic_hidden, cfg.num_critics, cfg.activation,
                                  cfg.critic_layer_norm)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)

    def features(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return with_instruction(self.normalizer(obs[self.cfg.obs_key].float()), obs, self.cfg.instruction_key)

    def update_normalizer(self, obs: dict[str, torch.Tensor]) -> None:
        if isinstance(self.normalizer, RunningNormalizer):
            self.normalizer.update(obs[self.cfg.obs_key])

    def act(self, obs: dict[str, torch.Tensor], deterministic: bool = False) -> torch.Tensor:
        x = self.features(obs)
        if deterministic:
            return torch.tanh(self.actor(x)[0])
        return self.actor.sample(x)[0]

    def forward(self, state: torch.Tensor, instruction: torch.Tensor | None = None) -> torch.Tensor:
        """Deterministic action from a raw state tensor (and the instruction embedding, for a policy that reads
        one), normaliser included (what export traces)."""
        x = self.normalizer(state)
        if self.instruction_dim:
            x = torch.cat([x, instruction.to(x.dtype)], -1)
        return torch.tanh(self.actor(x)[0])


def _build(meta: dict[str, Any], cfg: SACPolicyConfig) -> SACPolicy:
    return SACPolicy(meta["obs_dim"], meta["action_dim"], cfg, instruction_dim(meta, cfg.instruction_key))


register_policy(PolicySpec("sac", "policy", SACPolicyConfig, _build, legacy_class="SACPolicy"))
