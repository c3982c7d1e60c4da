"""PPO on the native batched Hopper-v5 (``mujoco-Hopper-v5``, gymnasium's v5 definition): CleanRL's MuJoCo PPO settings
(64x64 tanh actor and critic, 2,048 env steps per iteration, 10 epochs x 32 minibatches, lr 3e-4, clip 0.2, entropy 0,
value coef 0.5, grad norm 0.5, gamma 0.99, lambda 0.95, observation normalisation), as 16 envs x 128 steps instead of
CleanRL's 1 x 2,048. With CleanRL's reward normalisation (running std of the discounted return, clip 10) and linear lr
annealing; value clipping at 0.2 (CleanRL: also 0.2, clip_vloss on). Differences from CleanRL: timeouts are
bootstrapped with V(final obs) (CleanRL treats them as terminal), advantages normalised per rollout (CleanRL: per
minibatch). One torch thread in the update: with tiny minibatches (64) two intra-op threads cost 25x more per
minibatch on a loaded 2-core machine (measured 257 vs 10 ms)."""

from rlrobot.algorithms.ppo import PPOConfig
from rlrobot.config import train_config
from rlrobot.policies.actor_critic import ActorCriticConfig

CONFIG = train_config("ppo", task="mujoco-Hopper-v5", num_envs=16, total_steps=1_000_000, control_mode="joint_torque",
                      ppo=PPOConfig(rollout_steps=128, num_epochs=10, num_minibatches=32, lr=3e-4, lr_schedule="linear",
                                    normalize_rewards=True,
                                    entropy_coef=0.0, value_coef=0.5, max_grad_norm=0.5, gamma=0.99, lam=0.95),
                      policy=ActorCriticConfig(actor_hidden=(64, 64), critic_hidden=(64, 64), activation="tanh",
                                               init_noise_std=1.0),
                      eval_every=50, eval_envs=8, eval_episodes=8, video=False,
                      update_threads=1)
