"""The runner of ``--algo vla-token-ppo`` (imported only when a run starts): chunk rollouts with batched token
decoding over the envs, then token-level PPO epochs."""

from __future__ import annotations

from rlrobot.algorithms.token_ppo import TokenPPO, collect
from rlrobot.runners.base import Runner


class TokenPPORunner(Runner):
    cheap_env_steps = True

    def __init__(self, cfg):
        super().__init__(cfg)
        self.policy = self.build_policy()
        self.algo = TokenPPO(self.policy, cfg.token_ppo)

    def train_iteration(self) -> dict[str, float]:
        batch, self.obs = collect(self.env, self.policy, self.obs, self.cfg.token_ppo, generator=self.generator,
                                  on_info=self.track_episodes)
        with self.all_cores():
            stats = self.algo.update(batch, generator=self.generator)
        tokens = batch["mask"].sum(1)
        return {**{f"train/{k}": v for k, v in stats.items()}, "train/tokens_per_chunk": float(tokens.mean()),
                "train/chunk_reward": float(batch["reward"].mean())}
