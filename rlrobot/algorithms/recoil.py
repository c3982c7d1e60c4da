"""ReCOIL, relaxed-coverage off-policy imitation (Sikchi, Zheng, Zhang & Niekum, "Dual RL", ICLR 2024; reference code
hari-sikchi's ReCOIL release, read at chufanchen/ReCOIL's first commits), and BC on the same data (``bc-union``).

Offline imitation from a few expert demonstrations plus arbitrary data, without rewards and without a discriminator.
Prior dual methods (SMODICE, ...) match the expert's visitation d^E from the data's d^O, which needs d^O to cover d^E.
ReCOIL matches mixtures instead, beta d^E + (1 - beta) d^S against beta d^pi + (1 - beta) d^S with d^S the union of
the expert and the arbitrary data, whose support always covers both; its dual is a Q-function problem solved like
f-DVL's (rlrobot/algorithms/fdvl.py), with an implicit maximiser V.

The practical algorithm (the reference's ``learner_imitate.py`` / ``critic_imitate.py``): each update draws a batch
from d^S (the union; ``--dataset`` plus the expert episodes) and one from d^E (``--recoil.expert-dataset``), rewards
unused. With Q' the min of the Polyak target critics:

- value (implicit maximiser over d^S): XQL's Gumbel loss on x = Q'(s, a) - V(s) (temperature ``value_temperature``,
  x / temperature capped at ``max_clip``, the batch-max scaling of ``fdvl.reverse_kl_loss``), or f-DVL's chi-square.
- critics (LS-IQ's bounded targets, the reference's stability trick): on d^S, TD to -g + gamma (1 - terminal) V(s')
  + gamma terminal (-q_E); on d^E, regression onto the expert value q_E = g / (1 - gamma) (g = ``reward_gap``; the
  reference's g = 2, q_E = 200 at gamma 0.99), each half weighted 1/2:
      L_Q = 1/2 E_{d^E}[(Q(s, a) - q_E)^2] + 1/2 E_{d^S}[(Q(s, a) - y)^2]
  so Q is high on expert actions and on actions whose successor state leads there, and a value of -q_E (the fixed
  point of the -g reward) elsewhere.
- actor: advantage-weighted regression on d^S, max E_{d^S}[ min(exp(beta (Q'(s, a) - V(s))), 100) log pi(a | s) ]
  (a Gaussian MLP with a tanh mean, acting with its mean).

Matched: the two batches (d^S includes the expert episodes), rewards zeroed, the Gumbel value loss on the d^S half
with the batch-max scaling and max_clip 7, the LS-IQ targets (g 2, q_E 200 at gamma 0.99) and terminal value -q_E,
MSE critics, AWR on the d^S half with beta 3 capped at 100, Polyak 0.005, lr 3e-4, 2 x 256 MLPs without LayerNorm,
the value from the target critics.

Changed: q_E follows gamma (g / (1 - gamma), the reference's 200 at its 0.99) so that another discount keeps the
targets consistent; one Adam step for the three losses from the same batches (the reference steps V first; here the
actor and critics use this step's V before its update); batch 256 per half (the reference: 1024); the actor's std is
state-dependent (``GaussianActor``); no cosine decay of the actor's learning rate (see fdvl.py). The terminal value
-q_E is the reference's locomotion convention (a termination is a fall); the SO-101 datasets end by time-out only.

``bc-union``: behaviour cloning on the same union d^S (the arbitrary data plus the expert episodes), the baseline the
paper compares with; it needs no rewards either.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal

import torch
import torch.nn.functional as F

from rlrobot.algorithms.bc import BC, BCConfig, GaussianActor
from rlrobot.algorithms.fdvl import chi_square_loss, reverse_kl_loss
from rlrobot.algorithms.offline import OfflineAlgorithm, OfflineConfig, adam, as_float, mlp, offline_spec, soft_update
from rlrobot.algorithms.registry import register_algorithm
from rlrobot.data.transitions import Transitions, load_transitions
from rlrobot.domains import NonNegative, NonNegativeInt, Positive, PositiveUnit
from rlrobot.policies.sac_policy import QEnsemble

if TYPE_CHECKING:
    from rlrobot.config import TrainConfig

MAX_WEIGHT = 100.0
VALUE_LOSSES = ("reverse-kl", "chi-square")


# ---------------------------------------------------------------------------------------------- the data
@dataclass
class ExpertData:
    """The expert demonstrations of an imitation algorithm (a mixin of its config section)."""

    expert_recipe: ClassVar[str] = "expert"
    """the dataset recipe whose episodes are the demonstrations (``rlrobot offline-bench`` writes and passes it)"""
    expert_dataset: str = ""
    """a LeRobotDataset of expert demonstrations of the same task (e.g. `rlrobot collect --recipe expert`); required"""
    expert_episodes: NonNegativeInt = 10
    """use only its first N episodes (0 = all): offline imitation's few demonstrations"""

    def check_expert(self, run: TrainConfig) -> None:
        name = run.spec.config_field
        if not self.expert_dataset:
            raise ValueError(f"algo={run.algo!r} needs --{name.replace('_', '-')}.expert-dataset DIR (expert demonstrations "
                             "of the task, e.g. from `rlrobot collect --recipe expert`)")
        if self.expert_episodes < 0:
            raise ValueError(f"{name}.expert_episodes must be >= 0 (0 = all), got {self.expert_episodes}")

    def prepare_expert(self) -> None:
        if self.expert_dataset and not (Path(self.expert_dataset) / "meta" / "info.json").is_file():
            raise FileNotFoundError(f"expert_dataset={self.expert_dataset!r} is not a LeRobotDataset (no meta/info.json)")


def load_expert(cfg: ExpertData, data: Transitions, obs_dim: int, action_dim: int, gamma: float) -> Transitions:
    """The expert episodes on ``data``'s device; refused (one line) if they were recorded on another task."""
    return load_transitions(cfg.expert_dataset, obs_shapes={"state": (obs_dim,)}, action_dim=action_dim,
                            task=data.info.get("task"), control_mode=None, gamma=gamma, device=data.device,
                            max_episodes=cfg.expert_episodes)


def union(first: Transitions, second: Transitions) -> Transitions:
    """The frames of both datasets as one (episodes of ``second`` after ``first``'s, renumbered; MC returns kept)."""
    out = {}
    offset = int(first.episode_index.max()) + 1 if len(first) else 0
    for f in fields(Transitions):
        a, b = getattr(first, f.name), getattr(second, f.name)
        if f.name == "episode_end":
            out[f.name] = None  # recomputed from the joined episode indices
        elif f.name == "episode_index":
            out[f.name] = torch.cat([a, b + offset])
        elif isinstance(a, torch.Tensor):
            out[f.name] = torch.cat([a, b])
        elif isinstance(a, dict) and f.name in ("obs", "next_obs"):
            out[f.name] = {k: torch.cat([a[k], b[k]]) for k in a}
        elif f.name == "info":
            out[f.name] = {**a, "union": [a.get("path"), b.get("path")]}
        elif f.name == "has_rewards":
            out[f.name] = a and b
        else:
            out[f.name] = a
    return Transitions(**out)


# ---------------------------------------------------------------------------------------------- ReCOIL
@dataclass
class ReCOILConfig(ExpertData, OfflineConfig):
    value_loss: Literal["reverse-kl", "chi-square"] = "reverse-kl"
    """the implicit maximiser of V: XQL's Gumbel loss (the reference) or f-DVL's chi-square"""
    value_temperature: Positive = 5.0
    """Gumbel temperature of the value loss (the reference's README example: 5; more is more pessimistic), or
    chi-square's alpha (in (0, 1])"""
    max_clip: Positive = 7.0
    """cap on (Q - V) / temperature in the Gumbel loss (the reference's default)"""
    reward_gap: Positive = 2.0
    """g: the d^S transitions' reward is -g and the expert value q_E = g / (1 - gamma) (LS-IQ; the reference: 2)"""
    beta: NonNegative = 3.0
    """inverse temperature of the actor's advantage weights (the reference's config: 3)"""
    tau: PositiveUnit = 0.005
    """Polyak rate of the target critics"""
    gamma: PositiveUnit = 0.99
    """discount (the reference's 0.99: q_E = 200 with g = 2)"""

    def validate(self, run: TrainConfig) -> None:
        super().validate(run)
        self.check_expert(run)
        if self.value_loss not in VALUE_LOSSES:
            raise ValueError(f"recoil.value_loss={self.value_loss!r} is not one of {VALUE_LOSSES}")
        if self.value_temperature <= 0 or (self.value_loss == "chi-square" and self.value_temperature > 1):
            raise ValueError(f"recoil.value_temperature must be > 0 (in (0, 1] for chi-square), got {self.value_temperature}")
        if self.gamma >= 1.0:
            raise ValueError(f"recoil.gamma must be < 1 (the expert value g / (1 - gamma) is finite), got {self.gamma}")
        for name in ("max_clip", "reward_gap"):
            if getattr(self, name) <= 0:
                raise ValueError(f"recoil.{name} must be > 0, got {getattr(self, name)}")
        if self.beta < 0:
            raise ValueError(f"recoil.beta must be >= 0, got {self.beta}")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"recoil.tau must be in (0, 1], got {self.tau}")

    def prepare(self, run: TrainConfig) -> None:
        super().prepare(run)
        self.prepare_expert()

    @property
    def expert_value(self) -> float:
        return self.reward_gap / (1.0 - self.gamma)


class ReCOIL(OfflineAlgorithm):
    """Networks: ``critic`` (2 members), ``critic_target``, ``value``, ``actor``. ``self.data`` is d^S (the union),
    ``self.expert`` d^E."""

    def __init__(self, cfg: ReCOILConfig, obs_dim: int, action_dim: int, data: Transitions | None,
                 device: torch.device | str, generator: torch.Generator | None = None, expert: Transitions | None = None):
        """``expert``: the demonstrations themselves (default: read from ``cfg.expert_dataset``)."""
        self.expert = None
        if data is not None:
            self.expert = expert if expert is not None else load_expert(cfg, data, obs_dim, action_dim, cfg.gamma)
            data = union(data, self.expert)
        super().__init__(cfg, obs_dim, action_dim, data, device, generator)
        nets = self.networks
        nets["critic"] = QEnsemble(obs_dim, action_dim, cfg.hidden, 2).to(self.device)
        nets["critic_target"] = copy.deepcopy(nets["critic"]).requires_grad_(False)
        nets["value"] = mlp(obs_dim, cfg.hidden, 1).to(self.device)
        nets["actor"] = GaussianActor(obs_dim, action_dim, cfg.hidden).to(self.device)
        self.optimizers["all"] = adam([*nets["critic"].parameters(), *nets["value"].parameters(),
                                       *nets["actor"].parameters()], lr=cfg.lr)

    def value_loss(self, x: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        if cfg.value_loss == "chi-square":
            return chi_square_loss(x, cfg.value_temperature).mean()
        return reverse_kl_loss(x, cfg.value_temperature, cfg.max_clip).mean()

    def losses(self, mixed: Transitions, expert: Transitions) -> dict[str, torch.Tensor]:
        cfg, nets = self.cfg, self.networks
        s, s_next, s_e = self.normalize(mixed.obs), self.normalize(mixed.next_obs), self.normalize(expert.obs)
        q_e_target = cfg.expert_value
        with torch.no_grad():
            q_target = nets["critic_target"](s, mixed.actions).min(0).values
        v = nets["value"](s).squeeze(-1)
        value_loss = self.value_loss(q_target - v)
        with torch.no_grad():
            advantage = q_target - v
            weights = torch.exp(cfg.beta * advantage).clamp(max=MAX_WEIGHT)
            next_v = nets["value"](s_next).squeeze(-1)
            alive = (~mixed.terminals).float()
            td_target = -cfg.reward_gap + cfg.gamma * (alive * next_v - (1.0 - alive) * q_e_target)
        q = nets["critic"](s, mixed.actions)
        q_e = nets["critic"](s_e, expert.actions)
        critic_loss = (0.5 * F.mse_loss(q_e, torch.full_like(q_e, q_e_target))
                       + 0.5 * F.mse_loss(q, td_target.expand_as(q))) * q.shape[0]
        actor_loss = -(weights * nets["actor"].log_prob(s, mixed.actions)).mean()
        return {"value": value_loss, "critic": critic_loss, "actor": actor_loss, "q": q.mean(), "q_expert": q_e.mean(),
                "v": v.mean(), "advantage": advantage.mean(), "weight": weights.mean()}

    def update(self) -> dict[str, float]:
        assert self.expert is not None, "this learner was built without data (to act only)"
        stats = self.losses(self.sample(), self.expert.sample(self.cfg.batch_size, self.generator))
        opt = self.optimizers["all"]
        opt.zero_grad(set_to_none=True)
        (stats["value"] + stats["critic"] + stats["actor"]).backward()  # disjoint parameters, detached targets
        opt.step()
        soft_update(self.networks["critic_target"], self.networks["critic"], self.cfg.tau)
        return as_float(stats)

    def act(self, obs: dict[str, torch.Tensor], deterministic: bool = True) -> torch.Tensor:
        return self.networks["actor"].act(self.normalize(obs), deterministic, None)


# ---------------------------------------------------------------------------------------------- BC on the union
@dataclass
class BCUnionConfig(ExpertData, BCConfig):
    """Behaviour cloning on the union of ``--dataset`` and the expert episodes (ReCOIL's baseline)."""

    def validate(self, run: TrainConfig) -> None:
        super().validate(run)
        self.check_expert(run)

    def prepare(self, run: TrainConfig) -> None:
        super().prepare(run)
        self.prepare_expert()


class BCUnion(BC):
    def __init__(self, cfg: BCUnionConfig, obs_dim: int, action_dim: int, data: Transitions | None,
                 device: torch.device | str, generator: torch.Generator | None = None, expert: Transitions | None = None):
        if data is not None:
            data = union(data, expert if expert is not None else load_expert(cfg, data, obs_dim, action_dim, cfg.gamma))
        super().__init__(cfg, obs_dim, action_dim, data, device, generator)


register_algorithm(offline_spec("recoil", "ReCOIL: offline imitation from expert demonstrations plus arbitrary data "
                                "(no rewards, no discriminator): dual-RL Q with an implicit maximiser V, AWR actor",
                                ReCOILConfig, ReCOIL, needs_rewards=False))
register_algorithm(offline_spec("bc-union", "behaviour cloning on the union of --dataset and expert demonstrations "
                                "(ReCOIL's baseline)", BCUnionConfig, BCUnion, needs_rewards=False))
