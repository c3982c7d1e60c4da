"""The runner of the warm starts (``rlrobot.algorithms.wsrl``: ``wsrl``, ``rlpd``, ``cal-ql-online``): the off-policy
runner (same collection, replay buffer, UTD bookkeeping, checkpoints and ``--resume``) plus

- ``--init``: the offline checkpoint's actor, critics, target critics, normaliser and temperature copied into the SAC
  policy before anything runs; until ``learning_starts`` env steps the frozen init policy acts (the warm-up) and no
  gradient step is made;
- ``--dataset``: the offline transitions kept beside the replay buffer (never in it); each batch takes
  ``offline_ratio`` of its rows from them (offline rows first, ``batch["offline_count"]`` of them);
- the switch point (the env step where gradient steps start) in the run's config.json (``warm_start.switch_step``), which
  ``rlrobot compare`` draws.
"""

from __future__ import annotations

from typing import Any

import torch

from rlrobot.algorithms.cal_ql import success_rewards
from rlrobot.algorithms.wsrl import WarmStartSAC, init_source, sac_weights_from_offline
from rlrobot.checkpoints import load_checkpoint, load_trainer_state
from rlrobot.config import TrainConfig
from rlrobot.data.transitions import load_transitions
from rlrobot.policies.registry import check_compatible
from rlrobot.runners.base import console
from rlrobot.runners.off_policy import OffPolicyRunner


def _frozen(obs: dict[str, torch.Tensor]) -> None:
    """The normaliser of a warm start keeps the statistics its networks were fitted to."""
    return None


class WarmStartRunner(OffPolicyRunner):
    learner_class = WarmStartSAC

    def __init__(self, cfg: TrainConfig):
        super().__init__(cfg)
        section = cfg.algorithm
        self.init_path = getattr(cfg, "init", "") if getattr(cfg, "init", "") not in ("", "none") else ""
        self.offline = None
        if getattr(cfg, "dataset", ""):
            self.offline = self._load_offline(cfg)
        if self.init_path:
            self._load_init(self.init_path)
            self.initialised_from = self.init_path
        elif self.offline is not None and getattr(self.policy.normalizer, "update", None):
            self.policy.normalizer.update(self.offline.obs["state"].float())  # RLPD: statistics of the dataset
        self.policy.update_normalizer = _frozen
        self.meta["warm_start"] = {
            "switch_step": int(section.learning_starts), "init": self.init_path, "dataset": getattr(cfg, "dataset", ""),
            "offline_ratio": float(getattr(section, "offline_ratio", 0.0)),
            "warmup_policy": "init" if self.init_path else "uniform random"}

    # ------------------------------------------------------------------ inputs
    def _load_offline(self, cfg: TrainConfig):
        space = self.env.single_observation_space
        data = load_transitions(cfg.dataset, obs_keys=("state",), obs_shapes={"state": tuple(space["state"].shape)},
                                action_dim=int(self.meta["action_dim"]), task=cfg.task, control_mode=cfg.control_mode,
                                gamma=cfg.algorithm.gamma, device=self.device, max_episode_steps=cfg.episode_steps())
        if not data.has_rewards:
            raise ValueError(f"dataset {cfg.dataset} has no 'next.reward' feature: algo={cfg.algo!r} needs rewards")
        if cfg.reward_mode == "sparse":
            data = success_rewards(data)  # the online env's sparse reward is its success flag
        if self.is_main:
            stats = data.episode_stats()
            console.print(f"{cfg.algo}: {stats['transitions']:,} offline transitions of {cfg.dataset} (success "
                          f"{stats['success_rate']:.2f}), {cfg.algorithm.offline_batch()} of each batch of "
                          f"{cfg.algorithm.batch_size}{data.bootstrap_note()}", soft_wrap=True)
        return data

    def _load_init(self, path: str) -> None:
        weights, saved, ckpt = load_checkpoint(path)
        check_compatible(saved, self.meta)
        source = init_source(saved)
        self.policy.load_state_dict(sac_weights_from_offline(weights, source), strict=True)
        try:
            state = load_trainer_state(ckpt)["algorithm"]
        except FileNotFoundError:
            state = {}
        if "log_alpha" in state:  # the pretrained temperature (Cal-QL and SAC save it with their trainer state)
            with torch.no_grad():
                self.algo.log_alpha.copy_(state["log_alpha"].to(self.device))
        if self.is_main:
            console.print(f"{self.cfg.algo}: actor, critics and normaliser from {ckpt} ({source}); warm-up "
                          f"{self.cfg.algorithm.learning_starts:,} env steps with this policy, no update", soft_wrap=True)

    # ------------------------------------------------------------------ hooks of the off-policy runner
    def random_actions(self) -> bool:
        return not self.init_path and super().random_actions()

    def sample_batch(self, batch_size: int) -> dict[str, Any]:
        n_off = self.cfg.algorithm.offline_batch() if self.offline is not None else 0
        online = self.replay.sample(batch_size - n_off, self.generator)
        if not n_off:
            return online
        off = self.offline.sample(n_off, self.generator)
        gamma = self.cfg.algorithm.gamma
        keys = list(online["obs"])
        return {
            "obs": {k: torch.cat([off.obs[k], online["obs"][k]]) for k in keys},
            "actions": torch.cat([off.actions, online["actions"]]),
            "rewards": torch.cat([off.rewards, online["rewards"]]),
            "next_obs": {k: torch.cat([off.next_obs[k], online["next_obs"][k]]) for k in keys},
            "terminated": torch.cat([off.terminals, online["terminated"]]),
            "discount": torch.cat([gamma * (~off.terminals).float(), online["discount"]]),
            "offline_count": n_off,
            "mc_returns": off.mc_returns,
        }

    def train_iteration(self) -> dict[str, float]:
        metrics = super().train_iteration()
        metrics["train/online"] = float(len(self.replay) >= self.cfg.algorithm.learning_starts)
        return metrics
