"""PPO on ManiSkill3 PushCube-v1 (state, dense reward). ManiSkill's own PPO baseline uses gamma 0.8 for its short
manipulation episodes (50 steps); the CPU sim is slow (one scene per env object), so the default budget is small."""

from rlrobot.algorithms.ppo import PPOConfig
from rlrobot.config import train_config

CONFIG = train_config("ppo", task="maniskill:PushCube-v1", num_envs=16, total_steps=200_000,
                      ppo=PPOConfig(rollout_steps=50, gamma=0.8, lam=0.9, num_minibatches=8, num_epochs=4, lr=3e-4,
                                    entropy_coef=0.0),
                      eval_every=50, eval_episodes=32, eval_envs=8, video=False)
