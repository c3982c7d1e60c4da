"""PPO on so101-reach: >= 0.95 eval success in under 3 minutes on a 2-core CPU (see README results)."""

from rlrobot.algorithms.ppo import PPOConfig
from rlrobot.config import TrainConfig

CONFIG = TrainConfig(task="so101-reach", algo="ppo", num_envs=128, total_steps=500_000,
                     ppo=PPOConfig(num_steps=24), eval_every=0, eval_episodes=64)
