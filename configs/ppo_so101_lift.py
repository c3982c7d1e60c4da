"""PPO on so101-lift from scratch with ManiSkill3 PickCube's recipe: its staged reward (``reward_mode="staged"``: reach,
grasp, held cube to a goal above its start, success as the maximum) and its PPO settings (gamma 0.8, lambda 0.9, no
entropy bonus, initial std 0.6, 50-step rollouts, lr 3e-4 fixed, 3x256 tanh actor and critic), sized for 2 CPU cores:
128 envs, 4 epochs x 8 minibatches of 800 (ManiSkill: 1,024 GPU envs, 8 epochs x 32). With the dense reward and
gamma 0.99 PPO hovers at the cube (0 success at 5M env steps)."""

from rlrobot.algorithms.ppo import PPOConfig
from rlrobot.config import train_config
from rlrobot.policies.actor_critic import ActorCriticConfig

CONFIG = train_config("ppo", task="so101-lift", reward_mode="staged", num_envs=128, total_steps=1_500_000,
                      ppo=PPOConfig(rollout_steps=50, num_epochs=4, num_minibatches=8, gamma=0.8, lam=0.9,
                                    entropy_coef=0.0, lr=3e-4, lr_schedule="fixed"),
                      policy=ActorCriticConfig(actor_hidden=(256, 256, 256), critic_hidden=(256, 256, 256),
                                               activation="tanh", init_noise_std=0.6),
                      eval_every=40, eval_episodes=64, update_threads=1)
