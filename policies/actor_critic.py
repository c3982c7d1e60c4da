"""MLP Gaussian actor-critic (RSL-RL style): state-independent log-std, separate critic, normaliser inside."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn
from torch.distributions import Normal

from rlrobot.domains import Positive, PositiveInt
from rlrobot.sections import Section

from .normalizer import RunningNormalizer
from .registry import PolicySpec, register_policy

ACTIVATIONS = {"elu": nn.ELU, "relu": nn.ReLU, "tanh": nn.Tanh, "silu": nn.SiLU}


class _FastTanhFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        y = torch.sigmoid(2.0 * x).mul_(2.0).sub_(1.0)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return torch.ops.aten.tanh_backward(grad, y)  # grad (1 - y^2), what torch.tanh's backward computes


class FastTanh(nn.Module):
    """tanh(x) computed as 2 sigmoid(2x) - 1 (within 2e-7 of torch.tanh, tested): on the CPU torch's tanh kernel is
    ~15x slower than its sigmoid (255 us against 16 us for a 256 x 256 tensor on one core here), about an eighth of a
    256x256 tanh MLP's PPO update. Opt-in (``activation="tanh-fast"``): not bit-identical to ``tanh``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _FastTanhFn.apply(x)


# what the actor-critic and SAC MLPs accept: the shared activations plus the CPU-fast tanh
MLP_ACTIVATIONS = {**ACTIVATIONS, "tanh-fast": FastTanh}


@dataclass
class ActorCriticConfig(Section):
    actor_hidden: tuple[PositiveInt, ...] = (256, 128, 64)
    """hidden layer widths of the actor MLP"""
    critic_hidden: tuple[PositiveInt, ...] = (256, 128, 64)
    """hidden layer widths of the critic MLP"""
    activation: Literal["elu", "relu", "tanh", "silu", "tanh-fast"] = "elu"
    """hidden activation; tanh-fast: tanh as 2 sigmoid(2x) - 1, several times faster on the CPU, within 2e-7 of tanh"""
    init_noise_std: Positive = 1.0
    """initial action std (Gaussian PPO policy)"""
    normalize_obs: bool = True
    """running mean / std normalisation of the observation, saved with the weights"""
    obs_key: str = "state"
    """the observation the MLPs read"""
    instruction_key: str = ""
    """an instruction embedding the MLPs also read, concatenated to the normalised state (e.g.
    "instruction_embedding" of the so101 suite tasks); "" = none (every task without instructions)"""

    def __post_init__(self):
        if self.activation not in MLP_ACTIVATIONS:
            raise ValueError(f"policy.activation={self.activation!r} is not one of {sorted(MLP_ACTIVATIONS)}")

    @property
    def read_keys(self) -> list[str]:
        """Every observation key the networks read (what rollout storage and replay must keep)."""
        return [self.obs_key] + ([self.instruction_key] if self.instruction_key else [])

    def observation_keys(self, run) -> tuple[str, ...]:
        return tuple(self.read_keys)

    def validate(self, run) -> None:
        if run.obs_mode == "rgb" and self.obs_key == "state":
            raise ValueError("obs_mode='rgb' gives no 'state' observation, and the MLP policy reads "
                             "policy.obs_key='state': use obs_mode='state' or 'state+rgb'")


def mlp(in_dim: int, hidden: tuple[int, ...], out_dim: int, activation: str) -> nn.Sequential:
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [nn.Linear(in_dim, h), MLP_ACTIVATIONS[activation]()]
        in_dim = h
    layers.append(nn.Linear(in_dim, out_dim))
    return nn.Sequential(*layers)


class ActorCritic(nn.Module):
    """Gaussian policy over actions in [-1, 1] (samples are clipped by the caller before reaching the env)."""

    def __init__(self, obs_dim: int, action_dim: int, cfg: ActorCriticConfig | None = None, instruction_dim: int = 0):
        super().__init__()
        cfg = cfg or ActorCriticConfig()
        self.cfg = cfg
        self.obs_dim, self.action_dim = obs_dim, action_dim
        self.instruction_dim = instruction_dim if cfg.instruction_key else 0
        self.normalizer = RunningNormalizer(obs_dim) if cfg.normalize_obs else nn.Identity()
        in_dim = obs_dim + self.instruction_dim
        self.actor = mlp(in_dim, cfg.actor_hidden, action_dim, cfg.activation)
        self.critic = mlp(in_dim, cfg.critic_hidden, 1, cfg.activation)
        self.log_std = nn.Parameter(torch.full((action_dim,), float(torch.log(torch.tensor(cfg.init_noise_std)))))
        # small last actor layer: initial actions near zero, exploration from the std (CleanRL / RSL-RL practice)
        nn.init.orthogonal_(self.actor[-1].weight, 0.01)
        nn.init.zeros_(self.actor[-1].bias)

    def features(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return with_instruction(self.normalizer(obs[self.cfg.obs_key]), obs, self.cfg.instruction_key)

    def update_normalizer(self, obs: dict[str, torch.Tensor]) -> None:
        if isinstance(self.normalizer, RunningNormalizer):
            self.normalizer.update(obs[self.cfg.obs_key])

    def distribution(self, x: torch.Tensor) -> Normal:
        mean, std = self.gaussian(x)
        return Normal(mean, std)

    def gaussian(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, std) of the action Gaussian, std expanded to the mean's shape (what ``distribution`` wraps)."""
        mean = self.actor(x)
        return mean, self.log_std.exp().expand_as(mean)

    def act(self, obs: dict[str, torch.Tensor], deterministic: bool = False) -> torch.Tensor:
        x = self.features(obs)
        mean = self.actor(x)
        if deterministic:
            return mean.clamp(-1.0, 1.0)
        return Normal(mean, self.log_std.exp().expand_as(mean)).sample()

    def value(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.critic(self.features(obs)).squeeze(-1)

    def forward(self, state: torch.Tensor, instruction: torch.Tensor | None = None) -> torch.Tensor:
        """Deterministic action from a raw state tensor (and the instruction embedding, for a policy that reads
        one), normaliser included (what TorchScript / ONNX export)."""
        x = self.normalizer(state)
        if self.instruction_dim:
            x = torch.cat([x, instruction.to(x.dtype)], -1)
        return self.actor(x).clamp(-1.0, 1.0)


def with_instruction(x: torch.Tensor, obs: dict[str, torch.Tensor], key: str) -> torch.Tensor:
    """The features ``x`` with the observation's instruction embedding concatenated (``key`` "" = unchanged)."""
    if not key:
        return x
    if key not in obs:
        raise KeyError(f"the policy reads the instruction embedding {key!r}, which this batch lacks (it has "
                       f"{sorted(obs)}): the task has no instructions, or the runner did not store the key")
    return torch.cat([x, obs[key].to(x.dtype)], -1)


def instruction_dim(meta: dict[str, Any], key: str) -> int:
    """Width of the instruction embedding ``key`` in a checkpoint's observation space (0 when ``key`` is "")."""
    if not key:
        return 0
    space = meta.get("observation_space", {})
    if key not in space or len(space[key]) != 1:
        raise ValueError(f"policy.instruction_key={key!r} is not a vector observation of task {meta.get('task')!r}; "
                         f"it has {sorted(space)}")
    return int(space[key][0])


def _build(meta: dict[str, Any], cfg: ActorCriticConfig) -> ActorCritic:
    return ActorCritic(meta["obs_dim"], meta["action_dim"], cfg, instruction_dim(meta, cfg.instruction_key))


register_policy(PolicySpec("actor-critic", "policy", ActorCriticConfig, _build, legacy_class="ActorCritic"))
