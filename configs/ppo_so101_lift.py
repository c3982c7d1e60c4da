"""PPO on so101-lift (dense reward)."""

from rlrobot.algorithms.ppo import PPOConfig
from rlrobot.config import TrainConfig

CONFIG = TrainConfig(task="so101-lift", algo="ppo", num_envs=128, total_steps=5_000_000,
                     ppo=PPOConfig(num_steps=24), eval_every=60, eval_episodes=64)
