"""SAC on gymnasium's Pendulum-v1 through the gymnasium adapter: mean return >= -200 within 20k env steps."""

from rlrobot.algorithms.sac import SACConfig
from rlrobot.config import train_config
from rlrobot.policies.sac_policy import SACPolicyConfig

CONFIG = train_config("sac", task="gym:Pendulum-v1", num_envs=4, total_steps=20_000,
                      sac=SACConfig(batch_size=256, utd=1.0, learning_starts=1_000, rollout_steps=25,
                                    buffer_size=100_000),
                      policy=SACPolicyConfig(actor_hidden=(128, 128), critic_hidden=(128, 128), activation="relu",
                                            normalize_obs=False),
                      checkpoint_every=50, eval_envs=8, eval_episodes=8, video=False)
