"""PPO on so101-reach: >= 0.95 eval success in under 3 minutes on a 2-core CPU (see README results)."""

from rlrobot.algorithms.ppo import PPOConfig
from rlrobot.config import train_config

CONFIG = train_config("ppo", task="so101-reach", num_envs=128, total_steps=500_000,
                      ppo=PPOConfig(rollout_steps=24), eval_episodes=64)
