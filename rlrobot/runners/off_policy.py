"""Off-policy runner: collect from all envs at once into the algorithm's device replay buffer, then run UTD x
transitions SAC updates; log / evaluate / checkpoint (optionally with the replay buffer, ``--sac.save-replay``),
resumable.

One iteration = ``sac.rollout_steps`` vector steps (x num_envs transitions) followed by ``utd x transitions`` critic
gradient steps (the fractional part carries over, so any UTD is honoured on average), grouped in one update round per
transition that ends with the actor and temperature step (``rlrobot.algorithms.sac``). Until ``sac.learning_starts``
transitions exist, actions are uniform in [-1, 1] and nothing is updated.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from rlrobot.algorithms.sac import SAC
from rlrobot.checkpoints import load_extra_file
from rlrobot.config import TrainConfig
from rlrobot.envs.vec_env import POLICY_ACTED
from rlrobot.runners.base import Runner, console

REPLAY_FILE = "replay"


class OffPolicyRunner(Runner):
    learner_class: type[SAC] = SAC
    """the learner (SAC or a subclass: rlrobot.algorithms.wsrl); its config is the algorithm's section, a SACConfig"""

    def __init__(self, cfg: TrainConfig):
        super().__init__(cfg)
        self.policy = self.build_policy()
        self.obs_keys = cfg.policy.read_keys  # what the networks read; images join when encoders do
        self.algo = self.learner_class(self.policy, cfg.algorithm, self.device, cfg.num_envs,
                                       self.obs_specs(self.obs_keys), sync=self.data_parallel)

    @property
    def replay(self):
        return self.algo.replay

    # ------------------------------------------------------------------ checkpoints
    def extra_checkpoint_files(self) -> tuple[dict[str, dict[str, torch.Tensor]], dict[str, Any]]:
        if not self.cfg.algorithm.save_replay:
            return {}, {}
        tensors, meta = self.algo.replay_state_dict()
        return {REPLAY_FILE: tensors}, {REPLAY_FILE: meta}

    def load_extra_checkpoint_files(self, ckpt: Path, meta: dict[str, Any]) -> None:
        replay = load_extra_file(ckpt, REPLAY_FILE) if meta.get(REPLAY_FILE) else None
        if replay is not None:
            self.algo.load_replay_state_dict(replay, meta[REPLAY_FILE])

    def after_restore(self, ckpt: Path) -> None:
        if len(self.replay) == 0:
            console.print(f"[yellow]{ckpt} holds no replay buffer (train with --sac.save-replay to keep it): the buffer "
                          f"refills with {self.cfg.algorithm.learning_starts:,} transitions from the current policy before "
                          "updates resume[/]")
        else:
            console.print(f"replay buffer restored: {len(self.replay):,} transitions")

    # ------------------------------------------------------------------ training
    def train_iteration(self) -> dict[str, float]:
        sac = self.cfg.algorithm
        start = time.perf_counter()
        self._collect()
        collect_time = time.perf_counter() - start
        metrics: dict[str, float] = {"perf/rollout_fraction": 1.0, "train/replay_size": float(len(self.replay))}
        if len(self.replay) < sac.learning_starts:
            return metrics
        rounds = self.algo.rounds_due(self.steps_per_iteration)
        if not rounds:
            return metrics
        update_start = time.perf_counter()
        with self.all_cores():
            sums: dict[str, torch.Tensor] = {}
            counts: dict[str, int] = {}  # actor terms appear only every sac.actor_update_every rounds
            for critic_steps in rounds:
                batches = [self.sample_batch(sac.batch_size) for _ in range(critic_steps)]
                for k, v in self.algo.update_round(batches, self.generator).items():
                    sums[k] = sums.get(k, 0.0) + v
                    counts[k] = counts.get(k, 0) + 1
        num_updates = sum(rounds)
        update_time = time.perf_counter() - update_start
        metrics.update({f"loss/{k}": float(v) / counts[k] for k, v in sums.items()})
        metrics.update({"perf/rollout_fraction": collect_time / (collect_time + update_time),
                        "perf/updates_per_s": num_updates / update_time, "train/updates": float(self.algo.num_updates)})
        return metrics

    def sample_batch(self, batch_size: int) -> dict[str, Any]:
        """One training batch (replay only here; rlrobot.runners.warm_start mixes offline data in)."""
        return self.replay.sample(batch_size, self.generator)

    def random_actions(self) -> bool:
        """Uniform random actions now? Until learning_starts transitions per rank (a warm start acts with its --init
        policy instead)."""
        return self.env_steps // self.sync.world_size < self.cfg.algorithm.learning_starts

    def _collect(self) -> None:
        cfg, env, policy = self.cfg, self.env, self.policy
        # per rank: each rank's buffer must hold learning_starts transitions; a resumed run without replay refills
        # on-policy
        random_phase = self.random_actions()
        key = cfg.policy.obs_key
        with torch.inference_mode():
            obs = self.obs
            for _ in range(cfg.algorithm.rollout_steps):
                if random_phase:
                    action = torch.rand(cfg.num_envs, self.meta["action_dim"], device=self.device,
                                        generator=self.generator) * 2.0 - 1.0
                else:
                    action = policy.act(obs)
                next_obs, reward, terminated, truncated, info = env.step(action)
                # keep: JSRL's guided env marks the learner's own steps; a guide's transition never enters the replay
                self.replay.add(obs, action, reward, terminated, truncated, next_obs, info["final_obs"],
                                keep=info.get(POLICY_ACTED))
                policy.update_normalizer(self.gather_obs({key: obs[key]}))
                self.track_episodes(info)
                obs = next_obs
        self.obs = obs
