"""Warm starts from offline RL to online RL, all SAC learners in one runner
(``rlrobot.runners.warm_start.WarmStartRunner``, an ``OffPolicyRunner``):

- ``wsrl`` (WSRL, Zhou et al. 2024): the actor, critics, target critics, observation normaliser and temperature of an
  offline checkpoint (``--init``: an ``--algo cal-ql`` run, ideally pretrained with a REDQ ensemble of 10 LayerNorm
  critics, ``--cal-ql.num-critics 10 --cal-ql.num-target-critics 2 --cal-ql.critic-layer-norm``); a warm-up of
  ``wsrl.learning_starts`` env steps collected by that frozen policy with no gradient step; then SAC at high UTD on
  the online replay only. The offline data are never loaded: the replay buffer holds online transitions only.
- ``cal-ql-online`` ("keep the offline data"): the same init, then Cal-QL continued online: every batch half offline
  (``--dataset``), half online, the conservative regulariser kept on the offline half (calibrated by its MC returns).
- ``rlpd`` (RLPD, Ball et al. 2023): random init, every batch half offline / half online (symmetric sampling), a
  LayerNorm critic ensemble (10, random target subset of 2, in its presets) at high UTD.
- SAC from scratch is ``--algo sac`` with the same sizes (the presets in configs/ match them).

The observation normaliser of a warm start is fixed: from the ``--init`` checkpoint (fitted on its dataset) or fitted
once on ``--dataset`` (RLPD); the pretrained networks were fitted to those statistics.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

import torch

from rlrobot.algorithms.cal_ql import conservative_penalty
from rlrobot.algorithms.registry import ALGORITHMS, AlgorithmSpec, algorithm_spec, register_algorithm
from rlrobot.algorithms.sac import SAC, SACConfig
from rlrobot.algorithms.sft import DatasetInput
from rlrobot.checkpoints import load_config, load_section, saved_train
from rlrobot.data.transitions import action_feature, check_dataset, dataset_meta
from rlrobot.domains import NonNegative, NonNegativeInt, OpenUnitInterval, Positive, PositiveInt
from rlrobot.policies.registry import policy_kind_of
from rlrobot.policies.sac_policy import SACPolicyConfig

WARM_START_RUNNER = "rlrobot.runners.warm_start:WarmStartRunner"


def sac_compatible_algorithms() -> list[str]:
    """The algorithms whose checkpoints a warm start continues from (their spec's ``sac_compatible``)."""
    return [spec.name for spec in ALGORITHMS.specs() if spec.sac_compatible]


@dataclass
class WarmStartInit:
    init: str = ""
    """offline checkpoint or run directory to start from: an --algo cal-ql run (or any algorithm whose actor and critics
    fit SAC: cal-ql, or a SAC run)"""


@dataclass
class WarmStartConfig(SACConfig):
    """SAC plus what a warm start adds; the subclasses below set the defaults of each method."""

    def offline_batch(self) -> int:
        """Transitions of each batch drawn from --dataset (the rest from the online replay buffer)."""
        return int(round(self.batch_size * getattr(self, "offline_ratio", 0.0)))

    def validate(self, run) -> None:
        name = run.spec.config_field
        online = self.batch_size - self.offline_batch()
        # SAC's checks, with the online share of the batch the replay must hold at learning start
        try:
            SACConfig.validate(dataclasses.replace(self, batch_size=max(online, 1)), run)
        except ValueError as e:
            raise ValueError(str(e).replace("sac.", f"{name}.")) from None
        ratio = getattr(self, "offline_ratio", None)
        if ratio is not None and not 0.0 < ratio < 1.0:
            raise ValueError(f"{name}.offline_ratio must be in (0, 1) (share of each batch from --dataset), got {ratio}")
        if ratio is not None and self.n_step != 1:
            raise ValueError(f"{name}.n_step must be 1 when batches mix in offline transitions, got {self.n_step}")
        if ratio is not None and not getattr(run, "dataset", ""):
            raise ValueError(f"algo={run.algo!r} mixes offline data into every batch: pass --dataset DIR (a LeRobotDataset "
                             "with rewards, e.g. from `rlrobot collect --recipe noisy`)")
        if hasattr(run, "init") and run.init in ("", "none") and not run.resume:
            raise ValueError(f"algo={run.algo!r} starts from an offline checkpoint: pass --init RUN_DIR (an --algo "
                             f"{' / '.join(sac_compatible_algorithms())} run); from scratch use --algo sac or --algo rlpd")
        if len(run.policy.read_keys) > 1 and ratio is not None:
            raise ValueError(f"algo={run.algo!r} mixes in offline data, which hold the state only; the policy reads "
                             f"{run.policy.read_keys}")

    def prepare(self, run) -> None:
        if hasattr(run, "init") and run.init not in ("", "none"):
            adopt_offline_init(run)
        if getattr(run, "dataset", ""):
            check_offline_dataset(run)


@dataclass
class WSRLConfig(WarmStartConfig):
    utd: Positive = 4.0
    """critic gradient steps per collected transition after the warm-up, with one actor and temperature step per
    collected transition (WSRL: 4)"""
    batch_size: PositiveInt = 256
    """transitions per critic step, online data only (WSRL: one batch of 1,024 split into 4 critic minibatches)"""
    actor_batch: Literal["last", "round"] = "round"
    """the actor and temperature step reads all of the round's critic minibatches (WSRL: the batch of 1,024)"""
    learning_starts: NonNegativeInt = 5_000
    """the warm-up: env steps collected by the frozen --init policy (no gradient step) before SAC starts (WSRL: 5,000)"""
    actor_delay: NonNegativeInt = 0
    """gradient steps after the switch that update the critics (and their targets) only: the actor and the temperature
    stay as the --init run left them while the critics recalibrate to the online data (0: SAC from the first step)"""
    backup_entropy: bool = False
    """subtract alpha log pi(a'|s') in the TD target (SAC's soft target); False (WSRL's reference): the target without
    it, as the Cal-QL pretraining fitted the critics, so the targets do not change at the offline-to-online switch"""

    def validate(self, run) -> None:
        super().validate(run)
        if self.actor_delay < 0:
            raise ValueError(f"wsrl.actor_delay must be >= 0 (critic-only gradient steps after the switch), got "
                             f"{self.actor_delay}")


@dataclass
class RLPDConfig(WarmStartConfig):
    utd: Positive = 20.0
    """critic gradient steps per collected transition, with one actor and temperature step per collected transition
    (RLPD: up to 20)"""
    batch_size: PositiveInt = 256
    """transitions per critic step, offline_ratio of them from --dataset"""
    learning_starts: NonNegativeInt = 5_000
    """transitions collected with uniform random actions before the first update"""
    offline_ratio: OpenUnitInterval = 0.5
    """share of each batch drawn from --dataset (RLPD's symmetric sampling: 0.5)"""


@dataclass
class CalQLOnlineConfig(WarmStartConfig):
    utd: Positive = 1.0
    """critic gradient steps per collected transition (Cal-QL fine-tuning: 1)"""
    batch_size: PositiveInt = 256
    """transitions per critic step, offline_ratio of them from --dataset"""
    learning_starts: NonNegativeInt = 1_000
    """online transitions (collected by the --init policy) before the first update"""
    offline_ratio: OpenUnitInterval = 0.5
    """share of each batch drawn from --dataset (Cal-QL fine-tuning: 0.5)"""
    cql_alpha: NonNegative | None = None
    """weight of the conservative regulariser on the offline half (None: the --init run's cal_ql.cql_alpha)"""
    cql_actions: PositiveInt | None = None
    """uniform and policy actions per state in the regulariser (None: the --init run's cal_ql.num_actions)"""
    cql_temperature: Positive = 1.0
    """temperature of the regulariser's log-sum-exp"""
    calibrated: bool = True
    """floor the policy actions' Q at the offline data's MC returns (Cal-QL; False: CQL)"""

    def validate(self, run) -> None:
        super().validate(run)
        if self.cql_alpha is not None and self.cql_alpha < 0:
            raise ValueError(f"cal_ql_online.cql_alpha must be >= 0, got {self.cql_alpha}")
        if self.cql_actions is not None and self.cql_actions < 1:
            raise ValueError(f"cal_ql_online.cql_actions must be >= 1, got {self.cql_actions}")
        if self.cql_temperature <= 0:
            raise ValueError(f"cal_ql_online.cql_temperature must be > 0, got {self.cql_temperature}")


# ---------------------------------------------------------------------- --init: offline checkpoint -> SAC policy
def init_source(saved: dict[str, Any]) -> AlgorithmSpec:
    """The spec of the algorithm a checkpoint holds, if a warm start can continue from it (its networks fit SAC's)."""
    algo = saved.get("train", {}).get("algo", "")
    if algo in ALGORITHMS and algorithm_spec(algo).sac_compatible:
        return algorithm_spec(algo)
    raise ValueError(f"init holds an {algo or policy_kind_of(saved)!r} checkpoint; a warm start needs an actor and critics "
                     f"that fit SAC: a run of {', '.join(sac_compatible_algorithms())}")


def adopt_offline_init(run) -> None:
    """The --init run's networks become this run's policy architecture (and its discount, target subset, actor
    reduction and reward, which the pretrained critics were fitted to). Refuses another task or reward."""
    saved = load_config(run.init)
    source = init_source(saved)
    train = saved_train(saved)
    if train["task"] != run.task or train.get("control_mode") != run.control_mode:
        raise ValueError(f"init={run.init!r} was trained on task={train['task']!r} control_mode={train.get('control_mode')!r}; "
                         f"this run has task={run.task!r} control_mode={run.control_mode!r}")
    section = run.algorithm
    init_section = load_section(saved, source.config_field, source.config)
    if source.policy_kind == "sac":
        run.policy = load_section(saved, "policy", SACPolicyConfig)
        section.gamma = init_section.gamma
        return
    off = init_section
    trained_on = "success" if getattr(off, "reward", "dataset") == "success" else "dense"
    if trained_on != ("success" if run.reward_mode == "sparse" else "dense"):
        what = "sparse (success)" if trained_on == "success" else "dataset's dense"
        raise ValueError(f"init={run.init!r} was pretrained on the {what} reward; this run has --reward-mode "
                         f"{run.reward_mode} (pretrain with the same --reward-mode)")
    run.policy = SACPolicyConfig(actor_hidden=tuple(off.hidden), critic_hidden=tuple(off.hidden), activation="relu",
                                 normalize_obs=True, num_critics=off.num_critics, critic_layer_norm=off.critic_layer_norm,
                                 obs_key="state", instruction_key="")
    section.gamma = off.gamma
    section.num_target_critics = off.num_target_critics
    section.actor_q = off.actor_q
    if isinstance(section, CalQLOnlineConfig):
        if section.cql_alpha is None:
            section.cql_alpha = off.cql_alpha
        if section.cql_actions is None:
            section.cql_actions = off.num_actions


def check_offline_dataset(run) -> None:
    """--dataset of another task or control mode refused from its metadata (shapes are checked when it is loaded)."""
    check_dataset(run.dataset, obs_shapes={}, action_dim=_action_dim_of(run.dataset), task=run.task,
                  control_mode=run.control_mode)


def _action_dim_of(dataset: str) -> int:
    info, _ = dataset_meta(dataset)
    features = info.get("features", {})
    return int(features.get(action_feature(features), {}).get("shape", [0])[0])


def sac_weights_from_offline(weights: dict[str, torch.Tensor], source: AlgorithmSpec) -> dict[str, torch.Tensor]:
    """An offline checkpoint's weights under SACPolicy's names (Cal-QL: networks.{obs_norm,actor,critic,critic_target})."""
    if source.policy_kind == "sac":
        return dict(weights)
    names = {"networks.obs_norm.": "normalizer.", "networks.actor.": "actor.", "networks.critic.": "critic.",
             "networks.critic_target.": "critic_target."}
    out = {}
    for key, value in weights.items():
        for old, new in names.items():
            if key.startswith(old):
                out[new + key[len(old):]] = value
                break
    return out


# ---------------------------------------------------------------------- the learner
class WarmStartSAC(SAC):
    """SAC on batches that may start with ``batch["offline_count"]`` offline transitions; with a conservative weight
    (``cal-ql-online``) CQL(H)'s regulariser, floored at the offline MC returns (Cal-QL), is added to the critic loss
    on those rows. ``backup_entropy=False`` drops the entropy term from the TD target (WSRL, as the Cal-QL pretraining
    fitted the critics); ``actor_delay`` keeps the actor and temperature frozen for the first critic steps."""

    def critic_loss(self, x: torch.Tensor, batch: dict[str, Any], generator: torch.Generator | None
                    ) -> tuple[torch.Tensor, dict[str, Any]]:
        alpha = getattr(self.cfg, "cql_alpha", None) or 0.0
        conservative = alpha > 0 and bool(batch.get("offline_count"))
        if not conservative and getattr(self.cfg, "backup_entropy", True):
            return super().critic_loss(x, batch, generator)
        policy = self.policy
        next_x = policy.features(batch["next_obs"])
        with torch.no_grad():
            next_action, next_log_prob = policy.actor.sample(next_x)
            next_q = self._target_q(policy.critic_target(next_x, next_action), generator)
            if getattr(self.cfg, "backup_entropy", True):
                next_q = next_q - self.alpha * next_log_prob
            target = batch["rewards"] + batch["discount"] * next_q
        q = policy.critic(x, batch["actions"])
        td_loss = (q - target).square().mean(1).sum()
        stats = {"critic_loss": td_loss.detach(), "q_mean": q.detach().mean()}
        if not conservative:
            return td_loss, stats
        self._cql_generator = generator
        cql_loss = self.conservative_loss(x, q, batch)
        stats["cql_loss"] = cql_loss.detach()
        return td_loss + cql_loss, stats

    def conservative_loss(self, x: torch.Tensor, q: torch.Tensor, batch: dict[str, Any]) -> torch.Tensor:
        """alpha x CQL(H) on the first ``offline_count`` rows, per critic, summed over critics (as cal_ql.CalQL)."""
        cfg, policy, k = self.cfg, self.policy, self.cfg.cql_actions or 4
        n = int(batch["offline_count"])
        s = x[:n]
        with torch.no_grad():  # the regulariser trains the critics only
            s_next = policy.features({key: v[:n] for key, v in batch["next_obs"].items()})
            a_pi, logp_pi = policy.actor.sample(s.repeat_interleave(k, 0))
            a_next, logp_next = policy.actor.sample(s_next.repeat_interleave(k, 0))
        a_rand = torch.rand((n * k, policy.action_dim), device=s.device, generator=self._cql_generator) * 2.0 - 1.0
        actions = torch.cat([a_rand.view(n, k, -1), a_pi.view(n, k, -1), a_next.view(n, k, -1)], 1)
        q_all = policy.critic(s.repeat_interleave(3 * k, 0), actions.reshape(n * 3 * k, -1)).view(-1, n, 3 * k)
        q_rand, q_pi, q_next = q_all.split(k, dim=-1)
        penalty = conservative_penalty(q[:, :n], q_rand, q_pi, logp_pi.view(n, k), q_next, logp_next.view(n, k),
                                       policy.action_dim, cfg.cql_temperature,
                                       batch["mc_returns"] if cfg.calibrated else None)
        return cfg.cql_alpha * penalty.mean(1).sum()

    def actor_step(self, x: torch.Tensor, stats: dict[str, Any]) -> dict[str, Any]:
        """SAC's actor and temperature step, except during WSRL's ``actor_delay`` (the first critic steps after the
        switch), when the actor and the temperature keep the --init run's values."""
        if self.num_updates > getattr(self.cfg, "actor_delay", 0):
            return super().actor_step(x, stats)
        return stats


register_algorithm(AlgorithmSpec(
    name="wsrl", summary="WSRL: SAC from an offline checkpoint (--init), a warm-up with the frozen policy, then online "
    "data only", config_field="wsrl", config=WSRLConfig, policy_kind="sac", runner=WARM_START_RUNNER, sac_compatible=True,
    run_fields=(WarmStartInit,)))
register_algorithm(AlgorithmSpec(
    name="rlpd", summary="RLPD: SAC from scratch, each batch half offline (--dataset) / half online, LayerNorm ensemble",
    config_field="rlpd", config=RLPDConfig, policy_kind="sac", runner=WARM_START_RUNNER, run_fields=(DatasetInput,),
    sac_compatible=True))
register_algorithm(AlgorithmSpec(
    name="cal-ql-online", summary="Cal-QL fine-tuned online from --init, the offline data (--dataset) kept in every "
    "batch with the conservative regulariser", config_field="cal_ql_online", config=CalQLOnlineConfig, policy_kind="sac",
    runner=WARM_START_RUNNER, run_fields=(WarmStartInit, DatasetInput), sac_compatible=True))
