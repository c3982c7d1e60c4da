"""PPO on so101-lift (dense reward)."""

from rlrobot.algorithms.ppo import PPOConfig
from rlrobot.config import train_config

CONFIG = train_config("ppo", task="so101-lift", num_envs=128, total_steps=5_000_000,
                      ppo=PPOConfig(rollout_steps=24), eval_every=60, eval_episodes=64)
