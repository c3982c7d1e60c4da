"""SAC on so101-reach (dense reward, ee_delta control)."""

from rlrobot.algorithms.sac import SACConfig
from rlrobot.config import train_config
from rlrobot.policies.sac_policy import SACPolicyConfig

CONFIG = train_config("sac", task="so101-reach", num_envs=16, total_steps=40_000,
                      sac=SACConfig(gamma=0.9, batch_size=256, utd=0.5, learning_starts=2_000, rollout_steps=8,
                                    buffer_size=500_000),
                      policy=SACPolicyConfig(actor_hidden=(256, 256), critic_hidden=(256, 256), activation="relu",
                                            normalize_obs=False),
                      checkpoint_every=100, eval_every=80, eval_episodes=64)
