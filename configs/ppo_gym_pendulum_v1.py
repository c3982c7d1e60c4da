"""PPO on gymnasium's Pendulum-v1 through the gymnasium adapter."""

from rlrobot.algorithms.ppo import PPOConfig
from rlrobot.config import train_config
from rlrobot.policies.actor_critic import ActorCriticConfig

CONFIG = train_config("ppo", task="gym:Pendulum-v1", num_envs=16, total_steps=200_000,
                      ppo=PPOConfig(rollout_steps=200, lr=1e-3, gamma=0.95, entropy_coef=0.0, num_minibatches=8),
                      policy=ActorCriticConfig(actor_hidden=(64, 64), critic_hidden=(64, 64), init_noise_std=0.5),
                      eval_envs=8, eval_episodes=8, video=False)
