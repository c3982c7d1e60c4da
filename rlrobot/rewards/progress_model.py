"""Process reward models: ``(obs_before, obs_after, instruction) -> (progress delta in [-1, 1], done prob)``.

``ProgressRewardModel`` is the protocol the RL side (the ``prm:PATH`` reward, ``deploy --reward``) calls;
``VLACProgressModel`` is the learned implementation trained by ``rlrobot train --algo prm``
(``rlrobot.algorithms.progress_model``):

- a VLAC-style pair model: encoders of the two observations (``observation_encoder.py``: state MLP on normalised
  state; a small conv net per camera, trained here) and of the instruction's cached sentence embedding
  (all-MiniLM-L6-v2, 384-d), FiLM-fused, give the signed progress delta ``tanh(.)``. Its meaning is VLAC's *relative*
  progress: from a frame of progress V_b to one of progress V_a, delta = (V_a - V_b) / (1 - V_b) (clipped to
  [-1, 1]), so the value update ``V_{i+1} = V_i + (1 - V_i) * delta`` (``rlrobot.data.progress_labels.value_update``)
  rebuilds an episode's progress curve from its pairs. ``progress_head="value"`` computes that delta from one
  per-frame score instead, so pairs compose exactly;
- a VLA-RL-style completion model (``completion.py``): "is the task done?" on ``obs_after`` and the instruction, its
  probability the PRM's ``done``.

Everything is batched on the model's device; ``progress`` runs under ``torch.no_grad``. ``load_progress_model`` reads a
checkpoint of ``rlrobot train --algo prm`` (or ``--algo sarm``, LeRobot's SARM behind the same protocol) and refuses
one trained on another observation space (one-line ValueError naming the key).
"""

from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from rlrobot.checkpoints import load_checkpoint
from rlrobot.domains import Domain, NonNegativeInt, PositiveInt, UnitInterval
from rlrobot.envs.language import EMBEDDING_DIM, TOKENS_KEY
from rlrobot.policies.flow import FlowPolicyConfig
from rlrobot.rewards.completion import CompletionModel
from rlrobot.rewards.observation_encoder import ObservationEncoder, check_observation_space, mlp
from rlrobot.rewards.sarm import ADAPTER_FILE, load_sarm, sarm_from_checkpoint
from rlrobot.sections import Section

PROGRESS_HEADS = ("pair", "value")
TOKENS_EMBEDDING = "encoder.parts.instruction_tokens.embed.weight"
"""the token embedding's weight in a checkpoint: its rows are the vocabulary size the model was built with"""


@runtime_checkable
class ProgressRewardModel(Protocol):
    """What a process reward model offers the RL side. ``obs_*`` are env observation dicts ([B, ...] tensors on the
    model's device, images uint8 [B, 3, H, W]); only the keys in ``obs_keys`` are read."""

    obs_keys: tuple[str, ...]
    """the observation keys read (e.g. ("state",) or ("state", "image_front")); the instruction comes separately"""
    done_threshold: float
    """done_prob above this counts as done (VLAC: 0.9 on its 0..1 scale; ours is chosen on held-out F1)"""

    def progress(self, obs_before: dict[str, Tensor], obs_after: dict[str, Tensor], instruction_embedding: Tensor
                 ) -> tuple[Tensor, Tensor]:
        """([B] progress delta in [-1, 1], [B] done probability of obs_after), no gradients."""
        ...


# ---------------------------------------------------------------------------------------------- networks
@dataclass
class PRMNetConfig(Section):
    """Network of the learned PRM (``--prm-net.*``)."""

    obs_keys: tuple[str, ...] = ("state",)
    """observation keys the PRM reads: state and/or image_<camera> (the task's obs mode must provide them)"""
    state_hidden: tuple[PositiveInt, ...] = (256, 256)
    """state encoder MLP"""
    embed_dim: PositiveInt = 128
    """one observation's encoding"""
    text_dim: PositiveInt = 128
    """projection of the 384-d instruction embedding"""
    head_hidden: tuple[PositiveInt, ...] = (256, 256)
    """progress head MLP over (e_before, e_after, e_after - e_before) ("pair") or over one frame's encoding
    ("value"), FiLM-modulated by the instruction"""
    progress_head: str = "pair"
    """"pair": the delta is any function of the two frames (VLAC's pair model); "value": a per-frame score w(s) =
    -log(1 - V(s)) and delta = 1 - exp(w(s_before) - w(s_after)), i.e. (V_a - V_b) / (1 - V_b) of one per-frame
    progress V: the value update then telescopes, so a chain of pairs equals delta(s_0, s_t) at any stride (no pair
    error accumulates along an episode)"""
    conv_channels: tuple[PositiveInt, ...] = (16, 32, 32)
    """image encoder: stride-2 3x3 convs (a small net trained here), then a linear layer to embed_dim"""
    done_threshold: UnitInterval = 0.5
    """done_prob above this is done (``rlrobot train --algo prm`` sets it at the end to the best F1 on training frames)"""
    match_gate: bool = False
    """a match head P(the instruction fits this pair) multiplies the delta (trained by BCE: mismatched instructions 0,
    the episode's own 1), so a mismatched instruction's progress is driven to 0 rather than only regressed towards it"""
    state_entities: tuple[str, ...] = ()
    """entity-attention state encoder (the flow policy's, ``--flow.state-entities``; the suite preset:
    SO101Suite.state_entities): the instruction's words pick the named objects, container and zone, and
    ``entity_anchor`` adds their positions relative to the gripper and to each other, the relations "done" is made of.
    Empty: an MLP over the whole state"""
    entity_names: tuple[str, ...] = ()
    """(state_entities) each entity's name as instruction token ids (SO101Suite.entity_name_tokens); needs
    "instruction_tokens" in obs_keys"""
    entity_anchor: Annotated[int, Domain(low=-1)] = -1
    """(state_entities) state index of the gripper's xyz for the relational features (SO101Suite.tcp_index); -1 = none"""
    entity_queries: PositiveInt = 4
    """(state_entities) entities each observation picks (long-horizon names four: two cubes, a container, a zone)"""
    entity_dim: PositiveInt = 64
    """(state_entities) width of an entity token"""
    instruction_vocab: NonNegativeInt = 0
    """(instruction_tokens in obs_keys) size of the vocabulary the token ids index; 0 = the task's (the range of its
    instruction_tokens observation, read when the run builds the model)"""

    def validate(self, run=None) -> None:
        if not self.obs_keys:
            raise ValueError("prm_net.obs_keys must name at least one observation key (state, image_<camera>)")
        for key in self.obs_keys:
            if key not in ("state", TOKENS_KEY) and not key.startswith("image_"):
                raise ValueError(f"prm_net.obs_keys: {key!r} is not 'state', {TOKENS_KEY!r} or an image key "
                                 "'image_<camera>'")
        if self.progress_head not in PROGRESS_HEADS:
            raise ValueError(f"prm_net.progress_head must be one of {PROGRESS_HEADS}, got {self.progress_head!r}")
        if self.match_gate and self.progress_head != "pair":
            raise ValueError("prm_net.match_gate needs prm_net.progress_head 'pair' (the gate reads the pair's features)")
        if self.state_entities and "state" not in self.obs_keys:
            raise ValueError("prm_net.state_entities needs 'state' in prm_net.obs_keys")
        if self.entity_names and TOKENS_KEY not in self.obs_keys:
            raise ValueError(f"prm_net.entity_names needs {TOKENS_KEY!r} in prm_net.obs_keys (the names are matched "
                             "against the instruction's words)")
        if (self.entity_names or self.entity_anchor >= 0) and not self.state_entities:
            raise ValueError("prm_net.entity_names / entity_anchor need prm_net.state_entities")
        if self.state_entities and not self.entity_names:
            raise ValueError("prm_net.state_entities needs prm_net.entity_names (the PRM's entities are picked by the "
                             "instruction's words; the suite: SO101Suite.entity_name_tokens)")
        if self.state_entities:
            try:  # with the vocabulary still the task's (0), the entity names' ids are checked once it is known
                self.entity_config(self.instruction_vocab or sys.maxsize).validate()
            except ValueError as e:
                raise ValueError(str(e).replace("flow.", "prm_net.")) from None
        for name in ("state_hidden", "head_hidden", "conv_channels"):
            if any(h < 1 for h in getattr(self, name)):
                raise ValueError(f"prm_net.{name} must hold positive widths, got {getattr(self, name)}")
        if self.embed_dim < 1 or self.text_dim < 1:
            raise ValueError(f"prm_net.embed_dim and text_dim must be >= 1, got {self.embed_dim}, {self.text_dim}")
        if not 0.0 < self.done_threshold < 1.0:
            raise ValueError(f"prm_net.done_threshold must be in (0, 1), got {self.done_threshold}")

    def for_observation_space(self, space: Any) -> PRMNetConfig:
        """This network for a task's observation space (a gymnasium Dict space): a PRM that reads token ids and names
        no vocabulary size takes the task's, the range of its instruction_tokens observation."""
        if TOKENS_KEY not in self.obs_keys or self.instruction_vocab:
            return self
        net = replace(self, instruction_vocab=int(space[TOKENS_KEY].high.max()) + 1)
        net.validate()
        return net

    def entity_config(self, vocab: int = 0) -> FlowPolicyConfig:
        """The flow policy's config of the same entity-attention encoder (``rlrobot.policies.flow.EntityAttention``),
        over a vocabulary of ``vocab`` words (default: ``instruction_vocab``)."""
        keys = ("state", TOKENS_KEY) if self.entity_names else ("state",)
        return FlowPolicyConfig(obs_keys=keys, state_entities=self.state_entities, entity_names=self.entity_names,
                                entity_anchor=self.entity_anchor, entity_queries=self.entity_queries,
                                entity_dim=self.entity_dim, state_hidden=self.state_hidden, activation="silu",
                                instruction_vocab=vocab or self.instruction_vocab)


class VLACProgressModel(nn.Module):
    """The learned PRM: progress head (pairs) + completion model (done). Implements ``ProgressRewardModel``."""

    def __init__(self, obs_space: dict[str, list[int]], cfg: PRMNetConfig):
        super().__init__()
        missing = [k for k in cfg.obs_keys if k not in obs_space]
        if missing:
            raise ValueError(f"prm_net.obs_keys: {missing[0]!r} is not an observation of the task; it has {sorted(obs_space)}")
        if TOKENS_KEY in cfg.obs_keys and cfg.instruction_vocab < 2:
            raise ValueError(f"prm_net.instruction_vocab={cfg.instruction_vocab}: a PRM that reads {TOKENS_KEY!r} is built "
                             "with the task's vocabulary size (its instruction_tokens observation's range)")
        self.cfg = replace(cfg)  # a copy: calibrating the done threshold must not change the run's config
        self.obs_keys = tuple(cfg.obs_keys)
        self.observation_space = {k: list(obs_space[k]) for k in self.obs_keys}
        self.done_threshold = float(cfg.done_threshold)
        self.encoder = ObservationEncoder(obs_space, cfg)
        self.text = nn.Sequential(nn.Linear(EMBEDDING_DIM, cfg.text_dim), nn.SiLU())
        width = cfg.head_hidden[0]
        frames = 3 if cfg.progress_head == "pair" else 1  # (e_b, e_a, e_a - e_b) or one frame's encoding
        self.pair_in = nn.Linear(frames * cfg.embed_dim + cfg.text_dim, width)
        self.film = nn.Linear(cfg.text_dim, 2 * width)  # the instruction scales and shifts the pair features
        self.head = mlp(width, cfg.head_hidden[1:], 1)
        self.match = mlp(width, cfg.head_hidden[1:], 1) if cfg.match_gate else None
        self.completion = CompletionModel(obs_space, cfg)

    def fit_state_stats(self, states: Tensor) -> None:
        self.encoder.fit_state_stats(states)
        self.completion.encoder.fit_state_stats(states)

    def _features(self, inputs: list[Tensor], t: Tensor) -> Tensor:
        h = self.pair_in(torch.cat([*inputs, t], -1))
        scale, shift = self.film(t).chunk(2, -1)
        return nn.functional.silu(nn.functional.layer_norm(h, h.shape[-1:]) * (1.0 + scale) + shift)

    def frame_score(self, obs: dict[str, Tensor], instruction_embedding: Tensor) -> Tensor:
        """(progress_head "value") [B] w(s) = -log(1 - V(s)) up to a constant per instruction: higher is further."""
        return self.head(self._features([self.encoder(obs)], self.text(instruction_embedding.float()))).squeeze(-1)

    def pair_outputs(self, obs_before: dict[str, Tensor], obs_after: dict[str, Tensor], instruction_embedding: Tensor
                     ) -> tuple[Tensor, Tensor | None]:
        """([B] pre-squash progress delta, [B] match logit or None without ``match_gate``). The pre-squash delta is
        tanh's input ("pair" head) or w(s_after) - w(s_before) ("value" head; delta = 1 - exp(-it))."""
        if self.cfg.progress_head == "value":
            both = {k: torch.cat([obs_before[k], obs_after[k]]) for k in self.obs_keys}  # one encoder pass
            w_b, w_a = self.frame_score(both, instruction_embedding.repeat(2, 1)).chunk(2)
            return w_a - w_b, None
        e_b, e_a = self.encoder(obs_before), self.encoder(obs_after)
        h = self._features([e_b, e_a, e_a - e_b], self.text(instruction_embedding.float()))
        return self.head(h).squeeze(-1), (self.match(h).squeeze(-1) if self.match is not None else None)

    def delta_logits(self, obs_before: dict[str, Tensor], obs_after: dict[str, Tensor], instruction_embedding: Tensor
                     ) -> Tensor:
        """[B] pre-squash progress delta (without the match gate; ``delta`` applies it)."""
        return self.pair_outputs(obs_before, obs_after, instruction_embedding)[0]

    def delta(self, obs_before: dict[str, Tensor], obs_after: dict[str, Tensor], instruction_embedding: Tensor
              ) -> tuple[Tensor, Tensor | None]:
        """([B] progress delta in [-1, 1], [B] match logit or None): tanh(logit), times sigmoid(match) when gated;
        the value head's 1 - exp(w_b - w_a) = (V_a - V_b) / (1 - V_b), at least -1."""
        logit, match = self.pair_outputs(obs_before, obs_after, instruction_embedding)
        return self.squash_delta(logit, match), match

    def squash_delta(self, logit: Tensor, match: Tensor | None) -> Tensor:
        """``pair_outputs`` -> the delta in [-1, 1] (``delta``'s second half)."""
        if self.cfg.progress_head == "value":
            return 1.0 - torch.exp((-logit).clamp(max=math.log(2.0)))
        delta = torch.tanh(logit)
        return delta if match is None else delta * torch.sigmoid(match)

    def done_logits(self, obs: dict[str, Tensor], instruction_embedding: Tensor) -> Tensor:
        return self.completion(obs, instruction_embedding)

    @torch.no_grad()
    def progress(self, obs_before: dict[str, Tensor], obs_after: dict[str, Tensor], instruction_embedding: Tensor
                 ) -> tuple[Tensor, Tensor]:
        delta, _ = self.delta(obs_before, obs_after, instruction_embedding)
        done = torch.sigmoid(self.done_logits(obs_after, instruction_embedding))
        return delta, done

    def forward(self, obs_before: dict[str, Tensor], obs_after: dict[str, Tensor], instruction_embedding: Tensor
                ) -> tuple[Tensor, Tensor]:
        return self.progress(obs_before, obs_after, instruction_embedding)


# ---------------------------------------------------------------------------------------------- loading
def prm_metadata(model: VLACProgressModel) -> dict[str, Any]:
    """What a PRM checkpoint records to rebuild and check the model (``config.json["prm"]``)."""
    return {"kind": "vlac", "obs_keys": list(model.obs_keys), "observation_space": model.observation_space,
            "net": asdict(model.cfg)}


class PRMEnsemble(nn.Module):
    """Several PRMs of one observation space behind the protocol: the mean of their progress deltas and of their done
    probabilities; the done threshold is the mean of theirs. Independent seeds' pair errors partly cancel, so the
    value chain of a progress curve drifts less (measured on the suite: README, "Process reward models")."""

    def __init__(self, members: list[nn.Module], names: list[str] | None = None):
        super().__init__()
        if len(members) < 2:
            raise ValueError(f"a PRM ensemble needs at least 2 members, got {len(members)}")
        names = names or [f"member {i}" for i in range(len(members))]
        first = members[0]
        for name, member in zip(names[1:], members[1:], strict=True):
            if tuple(member.obs_keys) != tuple(first.obs_keys) or member.observation_space != first.observation_space:
                raise ValueError(f"PRM ensemble: {name} reads {member.observation_space}, {names[0]} reads "
                                 f"{first.observation_space}; members must share one observation space")
        self.members = nn.ModuleList(members)
        self.obs_keys = tuple(first.obs_keys)
        self.observation_space = dict(first.observation_space)
        self.done_threshold = float(sum(m.done_threshold for m in members) / len(members))

    @torch.no_grad()
    def progress(self, obs_before: dict[str, Tensor], obs_after: dict[str, Tensor], instruction_embedding: Tensor
                 ) -> tuple[Tensor, Tensor]:
        outputs = [m.progress(obs_before, obs_after, instruction_embedding) for m in self.members]
        return torch.stack([d for d, _ in outputs]).mean(0), torch.stack([p for _, p in outputs]).mean(0)

    def forward(self, obs_before: dict[str, Tensor], obs_after: dict[str, Tensor], instruction_embedding: Tensor
                ) -> tuple[Tensor, Tensor]:
        return self.progress(obs_before, obs_after, instruction_embedding)


def split_prm_paths(path: str | Path) -> list[str]:
    """``A,B,C`` (an ensemble) -> [A, B, C]; one path -> [path] (an empty member stays, for the caller to refuse)."""
    return str(path).split(",")


def load_progress_model(path: str | Path, device: str | torch.device = "cpu",
                        observation_space: dict[str, Any] | None = None) -> nn.Module:
    """A trained PRM from a run directory / checkpoint (``rlrobot train --algo prm`` or ``--algo sarm``), in eval mode
    on ``device``; ``A,B,C`` (comma-separated runs, e.g. seeds of one preset) loads their ``PRMEnsemble``.

    ``observation_space``: the env's (a gymnasium Dict space's ``.spaces``, or key -> shape); a PRM that reads a key
    the env lacks, or with another shape, is refused (ValueError naming the key). Only the checkpoint's
    ``obs_keys`` and ``instruction_embedding`` are read from observations. A SARM adapter directory (``save_sarm``)
    loads as that model, behind the same protocol."""
    paths = split_prm_paths(path)
    if len(paths) > 1:
        members = [load_progress_model(p, device, observation_space) for p in paths]
        return PRMEnsemble(members, paths).to(device).eval()
    if (Path(path) / ADAPTER_FILE).is_file():
        return load_sarm(path, device, observation_space)

    weights, config, ckpt = load_checkpoint(path)
    meta = config.get("prm")
    if not meta:
        raise ValueError(f"{ckpt} is not a process-reward-model checkpoint (no 'prm' entry in config.json; train one "
                         "with rlrobot train --algo prm)")
    if observation_space is not None:
        space = getattr(observation_space, "spaces", observation_space)
        check_observation_space(meta["observation_space"], space)
    if meta.get("kind") == "sarm":
        return sarm_from_checkpoint(meta, weights).to(device).eval()
    model = VLACProgressModel(meta["observation_space"], saved_net_config(meta["net"], weights))
    model.load_state_dict(weights)
    return model.to(device).eval()


def saved_net_config(net: dict[str, Any], weights: dict[str, Tensor]) -> PRMNetConfig:
    """The network config a checkpoint records (``config.json["prm"]["net"]``). One that records no
    ``instruction_vocab`` takes it from its token embedding's rows: the vocabulary the model was built with."""
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in net.items()}
    if "instruction_vocab" not in fields and TOKENS_EMBEDDING in weights:
        fields["instruction_vocab"] = int(weights[TOKENS_EMBEDDING].shape[0])
    return PRMNetConfig(**fields)
