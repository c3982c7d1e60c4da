"""SAC on the native batched Walker2d-v5 (``mujoco-Walker2d-v5``): CleanRL / SB3 defaults as
``sac_gym_halfcheetah_v5.py`` (UTD 1, batch 256, 256x256 ReLU networks, 5k random steps, 1M buffer), one env."""

from rlrobot.algorithms.sac import SACConfig
from rlrobot.config import train_config
from rlrobot.policies.sac_policy import SACPolicyConfig

CONFIG = train_config("sac", task="mujoco-Walker2d-v5", num_envs=1, total_steps=1_000_000, control_mode="joint_torque",
                      sac=SACConfig(gamma=0.99, batch_size=256, utd=1.0, learning_starts=5_000, rollout_steps=1_000,
                                    buffer_size=1_000_000),
                      policy=SACPolicyConfig(actor_hidden=(256, 256), critic_hidden=(256, 256), activation="relu",
                                            normalize_obs=False),
                      checkpoint_every=10, eval_every=50, eval_envs=4, eval_episodes=8, video=False)
