"""Flow-matching action-chunk policy (openpi / pi0 conventions) and the sampling steps that flow-policy RL needs.

Time runs from t = 1 (pure noise) to t = 0 (the action chunk): x_t = t * eps + (1 - t) * a, and the network predicts
the velocity v = eps - a. Sampling takes K Euler steps on the grid t_k = linspace(1, 1/K, K) followed by 0.

Every denoising step can be deterministic (the ODE, for evaluation and SFT) or a Gaussian transition whose mean and
std come from one of the two pi_RL recipes (Flow-Noise and Flow-SDE of the pi_RL paper):

* ``noise`` (Flow-Noise): the ODE mean with a learned std from a small noise head on the velocity network's features;
* ``sde`` (Flow-SDE): the Euler-Maruyama step of the reverse SDE with the same marginals, std sqrt(delta) * sigma_t,
  sigma_t = a * sqrt(t / (1 - t)).

Because every step of the chain is Gaussian given the previous state, the log-likelihood of a stored chain is exact
and can be recomputed under new parameters: that is what the PPO ratio of Flow-Noise / Flow-SDE PPO uses. The RL and
SFT code only use the ``FlowPolicy`` protocol below; ``FlowSampling`` implements the denoising loop, the chain
log-probs and flow matching on top of the protocol's ``encode`` / ``velocity`` / ``noise_std``, so a VLA adapter
(``policies/vla/``) that provides those three gets exact per-step log-probs from the same loop.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import nn

from rlrobot.domains import Domain, NonNegativeInt, Positive, PositiveInt, UnitInterval
from rlrobot.sections import Section

from .actor_critic import ACTIVATIONS, mlp
from .registry import PolicySpec, register_policy

SAMPLE_MODES = ("ode", "noise", "sde")
INSTRUCTION_KEY = "instruction_embedding"  # a sentence embedding (tasks/so101_suite.py): not normalised, fused
TOKENS_KEY = "instruction_tokens"  # token ids over a task's vocabulary (tasks/so101_suite.py): embedded per position


@dataclass
class FlowPolicyConfig(Section):
    chunk_size: PositiveInt = 5
    """H: actions per chunk"""
    denoising_steps: PositiveInt = 4
    """K: Euler denoising steps"""
    execute_steps: NonNegativeInt = 0
    """actions of each chunk executed open-loop before re-planning (0 = the whole chunk)"""
    obs_keys: tuple[str, ...] = ("state",)
    """observation keys the encoder reads: "state" and/or image keys such as "image_front" """
    state_hidden: tuple[PositiveInt, ...] = (256, 256)
    """widths of the state encoder MLP (the last is its output)"""
    embed_dim: PositiveInt = 256
    """observation embedding size"""
    time_embed_dim: PositiveInt = 64
    """size of the time embedding"""
    velocity_hidden: tuple[PositiveInt, ...] = (512, 512, 512)
    """widths of the velocity network"""
    activation: Literal["elu", "relu", "tanh", "silu"] = "silu"
    """hidden activation"""
    image_channels: tuple[PositiveInt, ...] = (32, 64, 64)
    """channels of the small CNN per camera (images only)"""
    noise_hidden: tuple[PositiveInt, ...] = (128, 64)
    """Flow-Noise head on the velocity network's last features"""
    noise_std_min: Positive = 0.08
    """lower bound of the Flow-Noise step std"""
    noise_std_max: Positive = 0.16
    """upper bound of the Flow-Noise step std"""
    value_hidden: tuple[PositiveInt, ...] = (256, 256)
    """value head on the detached observation embedding (used by flow-policy PPO)"""
    instruction_fusion: Literal["concat", "film"] = "concat"
    """how an "instruction_embedding" in obs_keys conditions the policy: "concat" (projected and concatenated with
    the other encoders' features) or "film" (scales and shifts the fused observation embedding)"""
    instruction_dim: PositiveInt = 64
    """width of the instruction projection ("concat")"""
    instruction_vocab: PositiveInt = 64
    """("instruction_tokens" in obs_keys) size of the token embedding table: at least the task's vocabulary"""
    state_entities: tuple[str, ...] = ()
    """entity-attention state encoder (language-conditioned suites): each entry is one kind of entity, written
    "start:count:width[+start:count:width...]": `count` entities whose features are the `width` values at
    state[start + i * width] (several parts concatenated per entity). The instruction ("instruction_tokens" or
    "instruction_embedding" in obs_keys) makes entity_queries queries; each picks entities by their learned identity
    (slot) and returns their features, so the policy reads the instructed object and goal and not the distractors.
    The state's other dimensions (the arm) go through the state MLP. Empty = the plain state MLP"""
    entity_dim: PositiveInt = 64
    """(state_entities) width of an entity token"""
    entity_queries: PositiveInt = 4
    """(state_entities) queries made from the instruction (e.g. object and goal of two subtasks)"""
    entity_names: tuple[str, ...] = ()
    """(state_entities, with "instruction_tokens") each entity's name as instruction token ids, space-separated, in
    state_entities order (the suite presets: SO101Suite.entity_name_tokens, e.g. the ids of "blue cube"). Grounds the
    attention in the words: an entity's key is the mean of its name's word vectors (fixed, random), each query pools
    the instruction's word vectors (learned weights over positions and words), scored by cosine similarity times a
    learned temperature; "blue" in the instruction then matches the blue cube from the first update, for every colour
    at once. Identity keys (empty) have to learn each object separately; on so101-push-to they stayed blurred
    (0.1-0.4 of the attention on the named cube after 10k updates)"""
    entity_anchor: Annotated[int, Domain(low=-1)] = -1
    """(state_entities) state index of the gripper's xyz (the suite: SO101Suite.tcp_index); >= 0 adds relational
    features in metres (x10): each picked entity's position minus the gripper's and the picked entities' pairwise
    differences (object to goal), the vectors a single-task state carries precomputed (so101-push: cube - pusher,
    target - cube). An entity's position is its first part's first 3 values (2-wide zones: z = 0). -1 = none"""
    state_std_min: Positive = 1e-3
    """floor of the state normaliser's std (fitted on the demonstrations): dimensions that barely move in the data
    (an object's tilt, ~1e-3) are otherwise scaled up to unit variance, and a policy fitted on a few demos keys on
    that noise (the suite presets raise it)"""
    mean_flow: bool = False
    """average-velocity (MeanFlow) head u(x_t, r, t): each denoising step jumps its whole interval [t_next, t] with the
    interval's mean velocity, so 1-2 steps sample a chunk; trained through the instantaneous velocity it induces"""
    mean_flow_ratio: UnitInterval = 0.25
    """(mean_flow) fraction of training samples with an interval r < t (the rest train r = t, plain flow matching)"""

    def observation_keys(self, run) -> tuple[str, ...]:
        return tuple(self.obs_keys)

    def validate(self, run=None) -> None:
        """The values alone, and with ``run`` against the rest of the run (observation keys, the episode length)."""
        self._validate_values()
        if run is None:
            return
        if run.obs_mode == "rgb" and "state" in self.obs_keys:
            raise ValueError("obs_mode='rgb' gives no 'state' observation; set flow.obs_keys to image keys "
                             "(e.g. image_front image_wrist) or use obs_mode='state+rgb'")
        episode = run.episode_steps()
        if episode and self.chunk_size > episode:
            raise ValueError(f"flow.chunk_size={self.chunk_size} is larger than the episode of {run.task} ({episode} steps)")

    def _validate_values(self) -> None:
        if self.chunk_size < 1:
            raise ValueError(f"flow.chunk_size must be >= 1, got {self.chunk_size}")
        if self.denoising_steps < 1:
            raise ValueError(f"flow.denoising_steps (K) must be >= 1, got {self.denoising_steps}")
        if not 0 <= self.execute_steps <= self.chunk_size:
            raise ValueError(f"flow.execute_steps={self.execute_steps} must be in [0, flow.chunk_size={self.chunk_size}] "
                             "(0 = the whole chunk)")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"flow.activation={self.activation!r} is not one of {sorted(ACTIVATIONS)}")
        if not 0 < self.noise_std_min <= self.noise_std_max:
            raise ValueError(f"flow.noise_std_min / noise_std_max must satisfy 0 < min <= max, got "
                             f"{self.noise_std_min} / {self.noise_std_max}")
        if not self.obs_keys:
            raise ValueError("flow.obs_keys must name at least one observation key")
        if self.instruction_fusion not in ("concat", "film"):
            raise ValueError(f"flow.instruction_fusion={self.instruction_fusion!r} is not one of ('concat', 'film')")
        if self.state_std_min <= 0:
            raise ValueError(f"flow.state_std_min must be > 0, got {self.state_std_min}")
        if not 0.0 <= self.mean_flow_ratio <= 1.0:
            raise ValueError(f"flow.mean_flow_ratio must be in [0, 1], got {self.mean_flow_ratio}")
        if INSTRUCTION_KEY in self.obs_keys and TOKENS_KEY in self.obs_keys:
            raise ValueError(f"flow.obs_keys: pick one instruction form, {INSTRUCTION_KEY!r} or {TOKENS_KEY!r}")
        self._validate_entities()
        if self.instruction_vocab < 2:
            raise ValueError(f"flow.instruction_vocab must be >= 2, got {self.instruction_vocab}")
        if set(self.obs_keys) <= {INSTRUCTION_KEY, TOKENS_KEY} and self.instruction_fusion == "film":
            raise ValueError("flow.instruction_fusion='film' modulates the other observations' embedding: add 'state' "
                             "or an image key to flow.obs_keys")

    def _validate_entities(self) -> None:
        if self.state_entities:
            if "state" not in self.obs_keys or not {INSTRUCTION_KEY, TOKENS_KEY} & set(self.obs_keys):
                raise ValueError("flow.state_entities needs 'state' and an instruction ('instruction_tokens' or "
                                 "'instruction_embedding') in flow.obs_keys")
            parse_entities(self.state_entities)
            if self.entity_dim < 1 or self.entity_queries < 1:
                raise ValueError(f"flow.entity_dim and flow.entity_queries must be >= 1, got {self.entity_dim} / "
                                 f"{self.entity_queries}")
        if self.entity_names:
            if not self.state_entities or TOKENS_KEY not in self.obs_keys:
                raise ValueError("flow.entity_names needs flow.state_entities and 'instruction_tokens' in flow.obs_keys")
            count = sum(parts[0][1] for parts in parse_entities(self.state_entities))
            if len(self.entity_names) != count:
                raise ValueError(f"flow.entity_names has {len(self.entity_names)} names; flow.state_entities has "
                                 f"{count} entities")
            for name in self.entity_names:
                ids = name.split()
                if not ids or not all(x.isdigit() and 1 < int(x) < self.instruction_vocab for x in ids):
                    raise ValueError(f"flow.entity_names entry {name!r}: space-separated token ids in "
                                     f"[2, flow.instruction_vocab={self.instruction_vocab})")
        if self.entity_anchor >= 0 and not self.state_entities:
            raise ValueError(f"flow.entity_anchor={self.entity_anchor} needs flow.state_entities (the entities whose "
                             "positions it relates)")


@runtime_checkable
class FlowPolicy(Protocol):
    """A flow-matching action-chunk policy as SFT and Flow-Noise / Flow-SDE PPO see it. Time runs from t = 1 (noise)
    to t = 0 (the chunk); chunks are flattened to ``flat_dim = chunk_size * action_dim``. ``FlowSampling`` implements
    everything from ``flow_matching_loss`` on with the first three methods."""

    chunk_size: int
    action_dim: int
    flat_dim: int
    denoising_steps: int
    """K Euler steps from t = 1 to t = 0"""
    execute_steps: int
    """actions of a chunk executed before re-planning (evaluation, serving, RL rollouts)"""

    def encode(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Observation -> embedding (for a VLA: the VLM prefix and its KV cache), computed once per observation."""
        ...

    def velocity(self, x_t: torch.Tensor, t: torch.Tensor, emb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(velocity [B, flat_dim], action-expert features [B, F]) at noisy chunks x_t [B, flat_dim] and times t [B]."""
        ...

    def noise_std(self, features: torch.Tensor) -> torch.Tensor:
        """Flow-Noise: the learned std of a denoising step from the expert features, [B, flat_dim]."""
        ...

    def value_from_embedding(self, emb: torch.Tensor) -> torch.Tensor:
        """State value [B] from the observation embedding (the critic of flow-policy PPO)."""
        ...

    def value(self, obs: dict[str, torch.Tensor]) -> torch.Tensor: ...

    def value_parameters(self) -> Iterable[nn.Parameter]:
        """Parameters of the value head (their own optimizer group, learning rate and gradient clip in PPO)."""
        ...

    def flow_matching_parameters(self) -> Iterable[nn.Parameter]:
        """What SFT trains: everything but the value and noise heads."""
        ...

    def fit_observation_stats(self, obs: dict[str, torch.Tensor]) -> None:
        """Set the observation normalisation from a dataset's observations (SFT, before training)."""
        ...

    def flow_matching_loss(self, obs: dict[str, torch.Tensor], actions: torch.Tensor, t: torch.Tensor,
                           noise: torch.Tensor, mask: torch.Tensor | None = None,
                           generator: torch.Generator | None = None) -> torch.Tensor: ...

    def sample_chain(self, obs: dict[str, torch.Tensor], mode: str = "ode", noise_level: float = 0.5,
                     stochastic_steps: torch.Tensor | None = None, generator: torch.Generator | None = None,
                     emb: torch.Tensor | None = None, x_init: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def chain_log_prob(self, obs: dict[str, torch.Tensor], chain: torch.Tensor, steps: torch.Tensor, mode: str,
                       noise_level: float = 0.5, emb: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...

    def sample_actions(self, obs: dict[str, torch.Tensor], deterministic: bool = True) -> torch.Tensor: ...


def time_grid(num_steps: int, device: torch.device | None = None) -> torch.Tensor:
    """openpi's grid: K points linspace(1, 1/K, K) then 0 (K + 1 values)."""
    return torch.cat([torch.linspace(1.0, 1.0 / num_steps, num_steps, device=device), torch.zeros(1, device=device)])


def sde_sigmas(grid: torch.Tensor, noise_level: float) -> torch.Tensor:
    """sigma_t = a * sqrt(t / (1 - t)) at the K step starts; at t = 1 the denominator uses the next grid point."""
    denom = torch.where(grid == 1.0, grid[1] if len(grid) > 2 else torch.zeros_like(grid[0]), grid)
    return noise_level * torch.sqrt(grid / (1.0 - denom))[:-1]


def gaussian_log_prob(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Elementwise log N(x; mean, std^2)."""
    return -((x - mean) / std).square() / 2 - std.log() - 0.5 * math.log(2 * math.pi)


def sinusoidal_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    half = dim // 2
    freqs = torch.exp(-math.log(1000.0) * torch.arange(half, device=t.device, dtype=t.dtype) / max(half - 1, 1))
    angles = t[:, None] * freqs[None] * 2 * math.pi
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


class ImageEncoder(nn.Module):
    """Small CNN for one uint8 camera image [B, 3, H, W] -> a feature vector."""

    def __init__(self, channels: tuple[int, ...], out_dim: int, image_size: int):
        super().__init__()
        layers: list[nn.Module] = []
        c_in = 3
        for c in channels:
            layers += [nn.Conv2d(c_in, c, 3, stride=2, padding=1), nn.GroupNorm(min(8, c), c), nn.SiLU()]
            c_in = c
        self.conv = nn.Sequential(*layers)
        with torch.no_grad():
            n = self.conv(torch.zeros(1, 3, image_size, image_size)).flatten(1).shape[1]
        self.proj = nn.Linear(n, out_dim)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.proj(self.conv(image.float() / 255.0 - 0.5).flatten(1))


def parse_entities(spec: tuple[str, ...]) -> list[list[tuple[int, int, int]]]:
    """flow.state_entities -> per entity kind, its parts (start, count, width); the parts of a kind share count."""
    kinds = []
    for entry in spec:
        parts = []
        for part in entry.split("+"):
            try:
                start, count, width = (int(x) for x in part.split(":"))
            except ValueError:
                raise ValueError(f"flow.state_entities entry {entry!r}: parts are 'start:count:width' integers") from None
            if start < 0 or count < 1 or width < 1:
                raise ValueError(f"flow.state_entities entry {entry!r}: need start >= 0, count >= 1, width >= 1")
            parts.append((start, count, width))
        if len({c for _, c, _ in parts}) != 1:
            raise ValueError(f"flow.state_entities entry {entry!r}: every part of an entity kind needs the same count")
        kinds.append(parts)
    return kinds


class TokenEncoder(nn.Module):
    """Instruction token ids [B, L] -> features: a learned vector per token plus one per position, flattened, so the
    word order (which colour names the object, which the goal) is kept. A sentence embedding hardly separates
    "push the blue cube to the red zone" from "push the red cube to the blue zone" (all-MiniLM-L6-v2: cosine 0.993)."""

    def __init__(self, vocab: int, length: int, out_dim: int, activation: str, dim: int = 16):
        super().__init__()
        self.vocab = vocab
        self.embed = nn.Embedding(vocab, dim)
        self.position = nn.Parameter(torch.zeros(length, dim))
        self.proj = nn.Sequential(nn.Linear(length * dim, out_dim), ACTIVATIONS[activation]())

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens.long().clamp(0, self.vocab - 1)) + self.position  # rollout storage keeps ids as floats
        return self.proj(x.flatten(1))


class EntityAttention(nn.Module):
    """Language-conditioned state encoder: the state's entities (objects, containers, zones) become tokens; queries
    made from the instruction attend over them by the entities' learned identities (keys are per-slot parameters, so
    which entity a query picks depends on the words only), and return the picked entities' features. The remaining
    state dimensions (the arm) go through an MLP. Few demonstrations then fit what the instruction names instead of
    the distractors' positions."""

    def __init__(self, spec: tuple[str, ...], state_dim: int, query_dim: int, cfg: FlowPolicyConfig,
                 query_length: int = 0):
        """``query_length``: the instruction's token count (entity_names)."""
        super().__init__()
        kinds = parse_entities(spec)
        d = cfg.entity_dim
        covered: set[int] = set()
        self.proj = nn.ModuleList()
        self.slots = nn.ParameterList()
        for k, parts in enumerate(kinds):
            count = parts[0][1]
            index = torch.tensor([[start + i * width + j for start, _, width in parts for j in range(width)]
                                  for i in range(count)])
            if int(index.max()) >= state_dim:
                raise ValueError(f"flow.state_entities entry {spec[k]!r} reaches state index {int(index.max())}; the "
                                 f"state has {state_dim} dimensions")
            covered |= set(index.flatten().tolist())
            self.register_buffer(f"index_{k}", index, persistent=False)
            self.proj.append(nn.Sequential(nn.Linear(index.shape[1], d), ACTIVATIONS[cfg.activation]()))
            self.slots.append(nn.Parameter(torch.randn(count, d) * 0.5))
        rest = [i for i in range(state_dim) if i not in covered]
        self.register_buffer("rest", torch.tensor(rest, dtype=torch.long), persistent=False)
        self.arm = mlp(len(rest), cfg.state_hidden[:-1], cfg.state_hidden[-1], cfg.activation)
        self.value = nn.Linear(d, d)
        self.num_queries, self.dim = cfg.entity_queries, d
        self.out_dim = cfg.state_hidden[-1] + cfg.entity_queries * d
        self.named = bool(cfg.entity_names)  # validate() checked one name per entity
        if not self.named:  # identity keys: queries from the instruction, keys from the slots
            self.query = nn.Linear(query_dim, cfg.entity_queries * d)
            self.key = nn.Linear(d, d)
        else:
            ids = [[int(x) for x in name.split()] for name in cfg.entity_names]
            names = torch.zeros(len(ids), max(map(len, ids)), dtype=torch.long)
            for m, row in enumerate(ids):
                names[m, : len(row)] = torch.tensor(row)
            self.register_buffer("name_ids", names, persistent=False)
            w = 32
            # fixed random word vectors (near-orthogonal in 32 dims): a word matches itself, and training cannot
            # collapse the match (learned ones drifted until the common words outweighed the names, tested)
            words = torch.randn(cfg.instruction_vocab, w, generator=torch.Generator().manual_seed(0))
            self.register_buffer("word_vectors", F.normalize(words, dim=-1) * math.sqrt(w))
            self.word_position = nn.Parameter(torch.zeros(query_length, w))
            self.pool_score = nn.Linear(w, cfg.entity_queries)  # which words each query reads
            self.query_map = nn.Linear(w, w, bias=False)
            self.key_map = nn.Linear(w, w, bias=False)
            nn.init.eye_(self.query_map.weight)  # the same word then matches itself from the first update
            nn.init.eye_(self.key_map.weight)
            self.log_temperature = nn.Parameter(torch.tensor(math.log(10.0)))  # scales the cosine similarity
        self.anchor = cfg.entity_anchor
        if self.anchor >= 0:
            if self.anchor + 3 > state_dim:
                raise ValueError(f"flow.entity_anchor={self.anchor}: the gripper's xyz would reach past the state's "
                                 f"{state_dim} dimensions")
            # each entity's position: its first part's first (up to) 3 state values; -1 pads a 2-wide one with z = 0
            position = torch.tensor([[start + i * width + j if j < width else -1 for j in range(3)]
                                     for (start, count, width), *_ in kinds for i in range(count)])
            self.register_buffer("position_index", position, persistent=False)
            q = cfg.entity_queries
            self.num_relations = q + q * (q - 1) // 2
            self.out_dim += 4 * self.num_relations  # a 3-vector and its length per relation

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        if self.named:  # checkpoints of earlier versions carry the identity-key layers, which named keys never used
            for name in ("query.weight", "query.bias", "key.weight", "key.bias"):
                state_dict.pop(prefix + name, None)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, state: torch.Tensor, instruction: torch.Tensor, raw_state: torch.Tensor | None = None,
                token_ids: torch.Tensor | None = None) -> torch.Tensor:
        """``state`` normalised; ``raw_state`` (in metres) for an anchor (the relational features); ``token_ids`` the
        instruction's ids for named entities."""
        tokens = torch.cat([proj(state[:, getattr(self, f"index_{k}")]) + slot
                            for k, (proj, slot) in enumerate(zip(self.proj, self.slots, strict=True))], dim=1)
        attention = self.attention(instruction, token_ids)
        picked = (attention @ self.value(tokens)).flatten(1)
        parts = [self.arm(state[:, self.rest]), picked]
        if self.anchor >= 0:
            parts.append(self.relations(raw_state, attention))
        return torch.cat(parts, dim=-1)

    def attention(self, instruction: torch.Tensor, token_ids: torch.Tensor | None = None) -> torch.Tensor:
        """[B, Q, M]: each query's weights over the entities (by their identity or name, not their features)."""
        if self.named:
            ids = token_ids.long().clamp(0, len(self.word_vectors) - 1)  # rollout storage keeps ids as floats
            words = self.word_vectors[ids]  # [B, L, w]
            score = self.pool_score(words + self.word_position).masked_fill((ids == 0)[..., None], -1e9)
            pooled = torch.softmax(score, dim=1).transpose(1, 2) @ words  # [B, Q, w]
            names = self.word_vectors[self.name_ids]
            keys = names.sum(1) / (self.name_ids > 0).sum(1, keepdim=True)  # [M, w]: mean of the name's words
            q, keys = F.normalize(self.query_map(pooled), dim=-1), F.normalize(self.key_map(keys), dim=-1)
            logits = q @ keys.T * self.log_temperature.exp()
        else:
            keys = self.key(torch.cat(list(self.slots), dim=0))  # [M, d]: identity only
            q = self.query(instruction).reshape(len(instruction), self.num_queries, self.dim)
            logits = q @ keys.T / math.sqrt(self.dim)
        return torch.softmax(logits, dim=-1)

    def relations(self, raw_state: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        """[B, 4 R]: the picked entities' positions relative to the gripper and to each other (x10 m), with lengths."""
        padded = torch.cat([raw_state, torch.zeros_like(raw_state[:, :1])], dim=1)  # index -1: the zero pad
        positions = attention @ padded[:, self.position_index]  # [B, Q, 3], the attention-weighted positions
        gripper = raw_state[:, self.anchor:self.anchor + 3]
        i, j = torch.triu_indices(self.num_queries, self.num_queries, offset=1, device=positions.device)
        vectors = torch.cat([positions - gripper[:, None], positions[:, j] - positions[:, i]], dim=1) * 10.0
        return torch.cat([vectors.flatten(1), vectors.norm(dim=-1)], dim=-1)


class FlowSampling:
    """Flow matching, the denoising loop and exact chain log-probs over the protocol's ``encode`` / ``velocity`` /
    ``noise_std``: what a ``FlowPolicy`` implementation (in-house or a VLA adapter) inherits."""

    denoising_steps: int
    flat_dim: int
    chunk_size: int
    action_dim: int

    def interval_starts(self, t: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor | None:
        """Interval starts r <= t for an average-velocity policy's training samples; None for an instantaneous one."""
        return None

    def training_velocity(self, x_t: torch.Tensor, t: torch.Tensor, emb: torch.Tensor,
                          r: torch.Tensor | None = None) -> torch.Tensor:
        """The velocity that flow matching and NFT regress onto eps - a: v(x_t, t) here; an average-velocity policy
        returns the instantaneous velocity its u(x_t, r, t) induces on [r, t]."""
        return self.velocity(x_t, t, emb)[0]

    def step_velocity(self, x_t: torch.Tensor, t: torch.Tensor, t_next: torch.Tensor, emb: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """(velocity, features) of one Euler step t -> t_next: v(x_t, t) here; an average-velocity policy returns
        u(x_t, t_next, t), the exact mean velocity over the step."""
        return self.velocity(x_t, t, emb)

    def flow_matching_loss(self, obs: dict[str, torch.Tensor], actions: torch.Tensor, t: torch.Tensor,
                           noise: torch.Tensor, mask: torch.Tensor | None = None,
                           generator: torch.Generator | None = None) -> torch.Tensor:
        """|| v(x_t, t) - (eps - a) ||^2 on chunks [B, H, A]; ``mask`` [B, H] drops padded steps past an episode."""
        a = actions.reshape(len(actions), -1)
        eps = noise.reshape(len(noise), -1)
        x_t = t[:, None] * eps + (1 - t[:, None]) * a
        v = self.training_velocity(x_t, t, self.encode(obs), self.interval_starts(t, generator))
        err = (v - (eps - a)).square().reshape(actions.shape)
        if mask is None:
            return err.mean()
        m = mask[:, :, None].to(err.dtype)
        return (err * m).sum() / (m.sum() * actions.shape[-1]).clamp_min(1.0)

    def step_distribution(self, x_t: torch.Tensor, k: torch.Tensor, emb: torch.Tensor, mode: str,
                          noise_level: float = 0.5) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Mean and std of step k (x at t_k -> x at t_{k+1}) for each row (``k`` an int64 tensor [B]), and the ODE
        step's mean from the same velocity (the deterministic steps of hybrid Flow-SDE). ``ode`` gives std 0."""
        grid = time_grid(self.denoising_steps, x_t.device)
        t = grid[k]
        delta = (t - grid[k + 1])[:, None]
        # the SDE's drift needs the instantaneous velocity (its score); ODE and Flow-Noise steps take the step's own
        v, features = self.velocity(x_t, t, emb) if mode == "sde" else self.step_velocity(x_t, t, grid[k + 1], emb)
        t = t[:, None]
        a_hat = x_t - t * v
        eps_hat = x_t + (1.0 - t) * v
        ode_mean = a_hat * (1.0 - (t - delta)) + eps_hat * (t - delta)  # = x_t - delta * v
        if mode == "sde":
            sigma = sde_sigmas(grid, noise_level)[k][:, None]
            mean = a_hat * (1.0 - (t - delta)) + eps_hat * ((t - delta) - sigma.square() * delta / (2.0 * t))
            std = (delta.sqrt() * sigma).expand_as(mean)
        else:
            mean = ode_mean
            std = self.noise_std(features) if mode == "noise" else torch.zeros_like(mean)
        return mean, std, ode_mean

    def sample_chain(self, obs: dict[str, torch.Tensor], mode: str = "ode", noise_level: float = 0.5,
                     stochastic_steps: torch.Tensor | None = None, generator: torch.Generator | None = None,
                     emb: torch.Tensor | None = None, x_init: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """Integrate noise -> chunk. Returns the chain [B, K + 1, H*A] (x at t_0 = 1 ... x at t_K = 0) and the
        elementwise log-density of every stochastic transition [B, K, H*A] (zero for deterministic steps).

        ``stochastic_steps`` [B, K] bool selects which steps draw noise (default: all of them unless ``mode`` is
        ``ode``); hybrid Flow-SDE passes one True per row. ``x_init`` replaces the initial noise draw.
        """
        if mode not in SAMPLE_MODES:
            raise ValueError(f"mode={mode!r} is not one of {SAMPLE_MODES}")
        emb = self.encode(obs) if emb is None else emb
        batch = emb.shape[0]
        x = torch.randn(batch, self.flat_dim, device=emb.device, generator=generator) if x_init is None else x_init
        chain = [x]
        log_probs = []
        for k in range(self.denoising_steps):
            ks = torch.full((batch,), k, device=emb.device, dtype=torch.long)
            mean, std, ode_mean = self.step_distribution(x, ks, emb, mode, noise_level)
            if mode == "ode":
                x = mean
                log_probs.append(torch.zeros_like(mean))
            else:
                active = torch.ones(batch, 1, dtype=torch.bool, device=emb.device) if stochastic_steps is None \
                    else stochastic_steps[:, k:k + 1]
                drawn = mean + std * torch.randn(mean.shape, device=emb.device, generator=generator)
                x = torch.where(active, drawn, ode_mean)
                log_probs.append(torch.where(active, gaussian_log_prob(x, mean, std.clamp_min(1e-12)),
                                             torch.zeros_like(mean)))
            chain.append(x)
        return torch.stack(chain, dim=1), torch.stack(log_probs, dim=1)

    def chain_log_prob(self, obs: dict[str, torch.Tensor], chain: torch.Tensor, steps: torch.Tensor, mode: str,
                       noise_level: float = 0.5, emb: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Elementwise log-densities of the stored transitions ``steps`` [B, S] (indices into the K steps) of
        ``chain`` [B, K + 1, D] under the current parameters: returns (log_prob [B, S, D], std [B, S, D], emb).
        All S steps of all rows are evaluated in one batched pass."""
        emb = self.encode(obs) if emb is None else emb
        batch, num = steps.shape
        x_in = chain.gather(1, steps[:, :, None].expand(-1, -1, chain.shape[-1]))
        x_out = chain.gather(1, (steps + 1)[:, :, None].expand(-1, -1, chain.shape[-1]))
        mean, std, _ = self.step_distribution(x_in.reshape(batch * num, -1), steps.reshape(-1),
                                              emb.repeat_interleave(num, dim=0), mode, noise_level)
        mean, std = mean.reshape(batch, num, -1), std.reshape(batch, num, -1)
        return gaussian_log_prob(x_out, mean, std), std, emb

    def chain_actions(self, x: torch.Tensor) -> torch.Tensor:
        """The action chunks [B, H, A] a chain's final state [B, H*A] commands (a VLA un-normalises them here)."""
        return x.reshape(-1, self.chunk_size, self.action_dim)

    def actions_to_chain(self, actions: torch.Tensor) -> torch.Tensor:
        """``chain_actions``' inverse on chunks [B, L, A]: the chain's space (a VLA normalises them here)."""
        return actions

    @contextmanager
    def hidden_chain_state(self, batch: int, device: torch.device) -> Iterator[Callable[[float], None]]:
        """For a sampler with its own denoising loop (RTC): yields ``advance(delta)``, to call after each step's one
        velocity call, which moves state the chain carries besides x (a VLA's padded action dims); a no-op here."""
        yield lambda delta: None

    @torch.no_grad()
    def sample_actions(self, obs: dict[str, torch.Tensor], deterministic: bool = True) -> torch.Tensor:
        """Action chunks [B, H, A]. Deterministic (evaluation): the ODE from the noise distribution's mode x = 0, so
        the same observation always gives the same chunk. Otherwise: random initial noise and Flow-Noise steps."""
        if deterministic:
            emb = self.encode(obs)
            chain, _ = self.sample_chain(obs, "ode", emb=emb, x_init=torch.zeros(len(emb), self.flat_dim, device=emb.device))
        else:
            chain, _ = self.sample_chain(obs, "noise")
        return self.chain_actions(chain[:, -1])


class MLPFlowPolicy(nn.Module, FlowSampling):
    """The in-house ``FlowPolicy``: a velocity network over flattened action chunks, conditioned on an observation
    embedding and a time embedding.

    The state normaliser's mean / std are buffers set from the demonstration statistics (``fit_observation_stats``), so
    they travel with the weights.
    """

    def __init__(self, obs_shapes: dict[str, tuple[int, ...]], action_dim: int, cfg: FlowPolicyConfig | None = None):
        super().__init__()
        cfg = cfg or FlowPolicyConfig()
        cfg.validate()
        missing = [k for k in cfg.obs_keys if k not in obs_shapes]
        if missing:
            raise ValueError(f"flow.obs_keys {missing} are not observations of this task; it has {sorted(obs_shapes)}")
        self.cfg = cfg
        self.obs_keys = tuple(cfg.obs_keys)
        self.action_dim = action_dim
        self.chunk_size = cfg.chunk_size
        self.denoising_steps = cfg.denoising_steps
        self.execute_steps = cfg.execute_steps or cfg.chunk_size
        self.flat_dim = cfg.chunk_size * action_dim
        act = cfg.activation
        branches: dict[str, nn.Module] = {}
        widths = 0
        self.film: nn.Linear | None = None
        self.tokens: TokenEncoder | None = None
        self.entities: EntityAttention | None = None
        for key in self.obs_keys:
            shape = obs_shapes[key]
            if key == TOKENS_KEY:
                self.tokens = TokenEncoder(cfg.instruction_vocab, shape[0], cfg.instruction_dim, act)
                if cfg.instruction_fusion == "film":
                    self.film = nn.Linear(cfg.instruction_dim, 2 * cfg.embed_dim)
                    nn.init.zeros_(self.film.weight)
                    nn.init.zeros_(self.film.bias)
                else:
                    widths += cfg.instruction_dim
            elif key == INSTRUCTION_KEY:
                if cfg.instruction_fusion == "film":
                    # zero-initialised: the policy starts as the unconditioned one, modulation is learnt
                    self.film = nn.Linear(shape[0], 2 * cfg.embed_dim)
                    nn.init.zeros_(self.film.weight)
                    nn.init.zeros_(self.film.bias)
                else:
                    branches[key] = nn.Sequential(nn.Linear(shape[0], cfg.instruction_dim), ACTIVATIONS[act]())
                    widths += cfg.instruction_dim
            elif len(shape) == 1:
                state_dim = shape[0]
                self.register_buffer("state_mean", torch.zeros(state_dim))
                self.register_buffer("state_std", torch.ones(state_dim))
                if cfg.state_entities:
                    query_dim = cfg.instruction_dim if TOKENS_KEY in self.obs_keys else obs_shapes[INSTRUCTION_KEY][0]
                    length = obs_shapes[TOKENS_KEY][0] if TOKENS_KEY in obs_shapes else 0
                    self.entities = EntityAttention(cfg.state_entities, state_dim, query_dim, cfg, length)
                    widths += self.entities.out_dim
                else:
                    branches[key] = mlp(state_dim, cfg.state_hidden[:-1], cfg.state_hidden[-1], act)
                    widths += cfg.state_hidden[-1]
            elif len(shape) == 3:
                branches[key] = ImageEncoder(cfg.image_channels, cfg.embed_dim, shape[-1])
                widths += cfg.embed_dim
            else:
                raise ValueError(f"observation {key!r} has shape {shape}: expected a vector or a [3, H, W] image")
        self.branches = nn.ModuleDict(branches)
        self.fuse = nn.Sequential(nn.Linear(widths, cfg.embed_dim), nn.LayerNorm(cfg.embed_dim), ACTIVATIONS[act]())
        self.time_mlp = nn.Sequential(nn.Linear(cfg.time_embed_dim, cfg.time_embed_dim), ACTIVATIONS[act]())
        in_dim = self.flat_dim + cfg.time_embed_dim + cfg.embed_dim
        self.mean_flow = cfg.mean_flow
        if cfg.mean_flow:  # the interval length t - r is a second time input (MeanFlow's (t, t - r) conditioning)
            self.gap_mlp = nn.Sequential(nn.Linear(cfg.time_embed_dim, cfg.time_embed_dim), ACTIVATIONS[act]())
            in_dim += cfg.time_embed_dim
        trunk: list[nn.Module] = []
        for h in cfg.velocity_hidden:
            trunk += [nn.Linear(in_dim, h), ACTIVATIONS[act]()]
            in_dim = h
        self.trunk = nn.Sequential(*trunk)
        self.velocity_out = nn.Linear(in_dim, self.flat_dim)
        self.noise_head = mlp(in_dim, cfg.noise_hidden, self.flat_dim, "tanh")
        self.value_head = mlp(cfg.embed_dim, cfg.value_hidden, 1, act)
        self.log_var_min = 2 * math.log(cfg.noise_std_min)
        self.log_var_max = 2 * math.log(cfg.noise_std_max)

    # ------------------------------------------------------------------ the FlowPolicy protocol
    def fit_observation_stats(self, obs: dict[str, torch.Tensor]) -> None:
        if "state" in obs and hasattr(self, "state_mean"):
            state = obs["state"].float()
            self.state_mean.copy_(state.mean(0).to(self.state_mean.device))
            self.state_std.copy_(state.std(0).clamp_min(self.cfg.state_std_min).to(self.state_std.device))

    def value_parameters(self) -> Iterable[nn.Parameter]:
        return self.value_head.parameters()

    def encoder_parameters(self) -> Iterable[nn.Parameter]:
        """What encode() runs: the observation branches, instruction tokens, entity attention, fusion and FiLM."""
        parts = [self.branches, self.fuse, self.tokens, self.entities, self.film]
        return [p for part in parts if part is not None for p in part.parameters()]

    def flow_matching_parameters(self) -> Iterable[nn.Parameter]:
        heads = {id(p) for head in (self.value_head, self.noise_head) for p in head.parameters()}
        return [p for p in self.parameters() if id(p) not in heads]

    def encode(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.tokens is not None or self.entities is not None:
            return self._encode_language(obs)
        parts = []
        for key in self.obs_keys:
            if key not in self.branches:
                continue
            parts.append(self.branches[key](self._branch_input(key, obs[key])))
        emb = self.fuse(torch.cat(parts, dim=-1))
        if self.film is not None:
            scale, shift = self.film(obs[INSTRUCTION_KEY].float()).chunk(2, dim=-1)
            emb = emb * (1.0 + scale) + shift
        return emb

    def _branch_input(self, key: str, x: torch.Tensor) -> torch.Tensor:
        """An observation as its branch reads it: the instruction embedding as float, a flat state normalised."""
        if key == INSTRUCTION_KEY:
            return x.float()
        if x.dim() == 2:
            return ((x - self.state_mean) / self.state_std).clamp(-10.0, 10.0)
        return x

    def _encode_language(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """encode() with instruction tokens and / or the entity-attention state encoder (the suite presets)."""
        words = self.tokens(obs[TOKENS_KEY]) if self.tokens is not None else None
        instruction = words if words is not None else obs[INSTRUCTION_KEY].float()
        parts = []
        for key in self.obs_keys:
            if key == TOKENS_KEY:
                if self.film is None:
                    parts.append(words)
                continue
            if key == INSTRUCTION_KEY and self.tokens is not None:
                continue  # the tokens carry the instruction
            if key not in self.branches and not (key == "state" and self.entities is not None):
                continue
            x = self._branch_input(key, obs[key])
            parts.append(self.entities(x, instruction, obs[key].float(), obs.get(TOKENS_KEY))
                         if key == "state" and self.entities is not None else self.branches[key](x))
        emb = self.fuse(torch.cat(parts, dim=-1))
        if self.film is not None:
            scale, shift = self.film(instruction).chunk(2, dim=-1)
            emb = emb * (1.0 + scale) + shift
        return emb

    def velocity(self, x_t: torch.Tensor, t: torch.Tensor, emb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """v(x_t, t | obs) on flattened chunks [B, H*A]; also returns the trunk features (input of the noise head).
        With the MeanFlow head this is u(x_t, t, t): the average over an empty interval is the instantaneous velocity."""
        return self.average_velocity(x_t, t, t, emb) if self.mean_flow else self._head(x_t, t, None, emb)

    def _head(self, x_t: torch.Tensor, t: torch.Tensor, gap: torch.Tensor | None, emb: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
        parts = [x_t, self.time_mlp(sinusoidal_embedding(t, self.cfg.time_embed_dim))]
        if gap is not None:
            parts.append(self.gap_mlp(sinusoidal_embedding(gap, self.cfg.time_embed_dim)))
        features = self.trunk(torch.cat([*parts, emb], dim=-1))
        return self.velocity_out(features), features

    # ------------------------------------------------------------------ the MeanFlow head
    def average_velocity(self, x_t: torch.Tensor, r: torch.Tensor, t: torch.Tensor, emb: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """u(x_t, r, t) = 1 / (t - r) * integral_r^t v(x_s, s) ds, so x_r = x_t - (t - r) u (MeanFlow)."""
        return self._head(x_t, t, t - r, emb)

    def step_velocity(self, x_t: torch.Tensor, t: torch.Tensor, t_next: torch.Tensor, emb: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.mean_flow:
            return self.velocity(x_t, t, emb)
        return self.average_velocity(x_t, t_next.expand_as(t), t, emb)

    def interval_starts(self, t: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor | None:
        """r = t for a (1 - mean_flow_ratio) share of the samples, else r ~ U(0, t)."""
        if not self.mean_flow:
            return None
        pick = torch.rand(t.shape, generator=generator, device=t.device) < self.cfg.mean_flow_ratio
        return torch.where(pick, t * torch.rand(t.shape, generator=generator, device=t.device), t)

    def training_velocity(self, x_t: torch.Tensor, t: torch.Tensor, emb: torch.Tensor,
                          r: torch.Tensor | None = None) -> torch.Tensor:
        """MeanFlow's identity v = u + (t - r) du/dt, as improved MeanFlow writes it: V = u(x_t, r, t) + (t - r) sg(du/dt)
        with the total derivative du/dt = (d/dx u) v_theta + d/dt u along the policy's own instantaneous velocity
        v_theta = u(x_t, t, t) (a JVP). Regressing V on eps - a trains u on every interval; with r = t it is plain
        flow matching. Gradients reach u only (the JVP term is a stopped-gradient correction)."""
        if not self.mean_flow or r is None:
            return self.velocity(x_t, t, emb)[0]
        u, _ = self.average_velocity(x_t, r, t, emb)
        gap = t - r
        if not bool((gap > 0).any()):
            return u
        with torch.no_grad():
            x, e, r0 = x_t.detach(), emb.detach(), r.detach()
            v_inst, _ = self.average_velocity(x, t.detach(), t.detach(), e)
            _, du_dt = torch.func.jvp(lambda x_, t_: self.average_velocity(x_, r0, t_, e)[0], (x, t.detach()),
                                      (v_inst, torch.ones_like(t)))
        return u + gap[:, None] * du_dt

    def noise_std(self, features: torch.Tensor) -> torch.Tensor:
        """Flow-Noise std: tanh output mapped linearly into [log sigma_min^2, log sigma_max^2]."""
        u = torch.tanh(self.noise_head(features))
        log_var = self.log_var_min + (u + 1.0) * 0.5 * (self.log_var_max - self.log_var_min)
        return torch.exp(0.5 * log_var)

    def value_from_embedding(self, emb: torch.Tensor) -> torch.Tensor:
        return self.value_head(emb.detach()).squeeze(-1)  # the critic does not shape the policy's encoder

    def value(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.value_from_embedding(self.encode(obs))

    def forward(self, state: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """Deterministic chunk [B, H, A] from a raw state and the initial noise (for export / serving)."""
        emb = self.encode({self.obs_keys[0]: state})
        x = noise.reshape(len(noise), -1)
        grid = time_grid(self.denoising_steps, x.device)
        for k in range(self.denoising_steps):
            t = grid[k].expand(len(x))
            v, _ = self.step_velocity(x, t, grid[k + 1], emb)
            x = x - (grid[k] - grid[k + 1]) * v
        return x.reshape(-1, self.chunk_size, self.action_dim)


def _build(meta: dict[str, Any], cfg: FlowPolicyConfig) -> MLPFlowPolicy:
    return MLPFlowPolicy({k: tuple(v) for k, v in meta["observation_space"].items()}, meta["action_dim"], cfg)


register_policy(PolicySpec("flow", "flow", FlowPolicyConfig, _build, legacy_class="FlowPolicy"))
