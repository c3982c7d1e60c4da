"""PPO on so101-push (dense reward)."""

from rlrobot.algorithms.ppo import PPOConfig
from rlrobot.config import TrainConfig

CONFIG = TrainConfig(task="so101-push", algo="ppo", num_envs=256, total_steps=3_600_000,
                     ppo=PPOConfig(num_steps=24), eval_every=40, eval_episodes=64)
