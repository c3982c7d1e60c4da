"""MLP Gaussian actor-critic (RSL-RL style): state-independent log-std, separate critic, normaliser inside."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn
from torch.distributions import Normal

from rlrobot.domains import NonNegativeInt, Positive, PositiveInt
from rlrobot.sections import Section

from .encoders import ENCODERS, ImageObservationEncoder
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
    image_keys: tuple[str, ...] = ()
    """camera observations the actor also reads through a CNN (e.g. image_front image_wrist of --obs-mode lerobot),
    their features concatenated after the normalised obs_key vector; () = none"""
    image_encoder: Literal["nature", "impala"] = "nature"
    """(image_keys) the CNN: nature (DQN's 3 convolutions, cheap) | impala (IMPALA's residual stages, ~5x the compute)"""
    image_features: PositiveInt = 128
    """(image_keys) features per camera (the CNN's LayerNorm + tanh head)"""
    shared_image_encoder: bool = True
    """(image_keys) one CNN for every camera (False: one CNN per camera)"""
    random_shift: NonNegativeInt = 4
    """(image_keys) DrQ's random shift in pixels, applied to the frames of a PPO update only (never to acting,
    evaluation or deploy); 0 = none"""
    critic_obs_key: str = ""
    """asymmetric actor-critic: the critic reads this vector observation instead of the actor's input (e.g.
    privileged_state of --obs-mode lerobot, the simulator's task state), with its own normaliser; "" = the actor's"""

    def __post_init__(self):
        if self.activation not in MLP_ACTIVATIONS:
            raise ValueError(f"policy.activation={self.activation!r} is not one of {sorted(MLP_ACTIVATIONS)}")

    @property
    def actor_keys(self) -> list[str]:
        """The observation keys the actor reads (what deploy must provide)."""
        return [self.obs_key] + ([self.instruction_key] if self.instruction_key else []) + list(self.image_keys)

    @property
    def read_keys(self) -> list[str]:
        """Every observation key the networks read (what rollout storage and replay must keep): the actor's, then the
        critic's own."""
        keys = self.actor_keys
        return keys + ([self.critic_obs_key] if self.critic_obs_key and self.critic_obs_key not in keys else [])

    def observation_keys(self, run) -> tuple[str, ...]:
        return tuple(self.read_keys)

    def validate(self, run) -> None:
        if run.obs_mode == "rgb" and self.obs_key == "state":
            raise ValueError("obs_mode='rgb' gives no 'state' observation, and the MLP policy reads "
                             "policy.obs_key='state': use obs_mode='state' or 'state+rgb'")
        self.validate_images(run)

    def validate_images(self, run) -> None:
        if self.image_encoder not in ENCODERS:
            raise ValueError(f"policy.image_encoder={self.image_encoder!r} is not one of {ENCODERS}")
        bad = [k for k in self.image_keys if not k.startswith("image_")]
        if bad:
            raise ValueError(f"policy.image_keys {bad} are not camera observations (image_<camera>, e.g. image_front)")
        if len(set(self.image_keys)) != len(self.image_keys):
            raise ValueError(f"policy.image_keys names a camera twice: {list(self.image_keys)}")
        renders = "rgb" in run.obs_mode or run.obs_mode == "lerobot"
        if self.image_keys and not renders:
            raise ValueError(f"policy.image_keys {list(self.image_keys)} need camera observations: obs_mode={run.obs_mode!r} "
                             "renders none (use --obs-mode lerobot, rgb or state+rgb)")
        if self.critic_obs_key.startswith("image_"):
            raise ValueError(f"policy.critic_obs_key={self.critic_obs_key!r}: the critic reads a vector observation "
                             "(e.g. privileged_state)")


def mlp(in_dim: int, hidden: tuple[int, ...], out_dim: int, activation: str) -> nn.Sequential:
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [nn.Linear(in_dim, h), MLP_ACTIVATIONS[activation]()]
        in_dim = h
    layers.append(nn.Linear(in_dim, out_dim))
    return nn.Sequential(*layers)


class ActorCritic(nn.Module):
    """Gaussian policy over actions in [-1, 1] (samples are clipped by the caller before reaching the env).

    The actor reads the normalised ``obs_key`` vector, the instruction embedding and the cameras' CNN features
    (``image_keys``); the critic reads the same features, or with ``critic_obs_key`` its own normalised vector (an
    asymmetric actor-critic: the simulator's state for the critic, what the arm gives for the actor)."""

    def __init__(self, obs_dim: int, action_dim: int, cfg: ActorCriticConfig | None = None, instruction_dim: int = 0,
                 image_shapes: dict[str, tuple[int, ...]] | None = None, critic_obs_dim: int = 0):
        super().__init__()
        cfg = cfg or ActorCriticConfig()
        self.cfg = cfg
        self.obs_dim, self.action_dim = obs_dim, action_dim
        self.instruction_dim = instruction_dim if cfg.instruction_key else 0
        self.obs_keys = tuple(cfg.actor_keys)
        """the observation keys the actor reads (serving and deploy give it these)"""
        self.normalizer = RunningNormalizer(obs_dim) if cfg.normalize_obs else nn.Identity()
        self.images = (ImageObservationEncoder(tuple(cfg.image_keys), image_shapes or {}, cfg.image_encoder,
                                               cfg.image_features, cfg.shared_image_encoder, cfg.random_shift)
                       if cfg.image_keys else None)
        in_dim = obs_dim + self.instruction_dim + (self.images.out_dim if self.images is not None else 0)
        self.actor = mlp(in_dim, cfg.actor_hidden, action_dim, cfg.activation)
        self.asymmetric = bool(cfg.critic_obs_key)
        if self.asymmetric and critic_obs_dim < 1:
            raise ValueError(f"policy.critic_obs_key={cfg.critic_obs_key!r} needs its observation's width (critic_obs_dim)")
        self.critic_normalizer = (RunningNormalizer(critic_obs_dim) if self.asymmetric and cfg.normalize_obs else nn.Identity())
        self.critic = mlp(critic_obs_dim if self.asymmetric else in_dim, cfg.critic_hidden, 1, cfg.activation)
        self.log_std = nn.Parameter(torch.full((action_dim,), float(torch.log(torch.tensor(cfg.init_noise_std)))))
        # small last actor layer: initial actions near zero, exploration from the std (CleanRL / RSL-RL practice)
        nn.init.orthogonal_(self.actor[-1].weight, 0.01)
        nn.init.zeros_(self.actor[-1].bias)

    def features(self, obs: dict[str, torch.Tensor], augment: bool = False) -> torch.Tensor:
        """The actor's input: normalised obs_key vector, instruction embedding, camera features (``augment``: the
        frames randomly shifted first, DrQ's augmentation; a learner's update asks for it, acting never does)."""
        x = with_instruction(self.normalizer(obs[self.cfg.obs_key]), obs, self.cfg.instruction_key)
        if self.images is not None:
            x = torch.cat([x, self.images(obs, augment)], -1)
        return x

    def critic_input(self, obs: dict[str, torch.Tensor], features: torch.Tensor | None = None) -> torch.Tensor:
        """The critic's input: the actor's ``features`` (computed if not given), or the normalised critic_obs_key."""
        if self.asymmetric:
            return self.critic_normalizer(obs[self.cfg.critic_obs_key].float())
        return self.features(obs) if features is None else features

    def update_normalizer(self, obs: dict[str, torch.Tensor]) -> None:
        if isinstance(self.normalizer, RunningNormalizer):
            self.normalizer.update(obs[self.cfg.obs_key])
        if isinstance(self.critic_normalizer, RunningNormalizer):
            self.critic_normalizer.update(obs[self.cfg.critic_obs_key])

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
        return self.critic(self.critic_input(obs)).squeeze(-1)

    def forward(self, state: torch.Tensor, instruction: torch.Tensor | None = None) -> torch.Tensor:
        """Deterministic action from a raw state tensor (and the instruction embedding, for a policy that reads
        one), normaliser included (what TorchScript / ONNX export)."""
        if self.images is not None:
            raise ValueError("forward(state) exports state policies; this actor also reads cameras: use act(obs)")
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


def image_shapes(meta: dict[str, Any], keys: tuple[str, ...]) -> dict[str, tuple[int, ...]]:
    """Shapes of the camera observations ``keys`` in a checkpoint's observation space (one-line error for a missing one)."""
    space = meta.get("observation_space", {})
    missing = [k for k in keys if k not in space]
    if missing:
        raise ValueError(f"policy.image_keys {missing} are not observations of task {meta.get('task')!r} in this obs mode; "
                         f"it has {sorted(space)}")
    return {k: tuple(space[k]) for k in keys}


def vector_dim(meta: dict[str, Any], key: str, field: str) -> int:
    """Width of the vector observation ``key`` in a checkpoint's observation space (0 when ``key`` is "")."""
    if not key:
        return 0
    space = meta.get("observation_space", {})
    if key not in space or len(space[key]) != 1:
        raise ValueError(f"{field}={key!r} is not a vector observation of task {meta.get('task')!r} in this obs mode; it "
                         f"has {sorted(space)}")
    return int(space[key][0])


def _build(meta: dict[str, Any], cfg: ActorCriticConfig) -> ActorCritic:
    obs_dim = meta["obs_dim"] if cfg.obs_key == "state" else vector_dim(meta, cfg.obs_key, "policy.obs_key")
    return ActorCritic(obs_dim, meta["action_dim"], cfg, instruction_dim(meta, cfg.instruction_key),
                       image_shapes(meta, tuple(cfg.image_keys)),
                       vector_dim(meta, cfg.critic_obs_key, "policy.critic_obs_key"))


register_policy(PolicySpec("actor-critic", "policy", ActorCriticConfig, _build, legacy_class="ActorCritic"))
