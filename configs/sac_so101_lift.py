"""SAC on so101-lift (dense reward, ee_delta control)."""

from rlrobot.algorithms.sac import SACConfig
from rlrobot.config import TrainConfig
from rlrobot.policies.actor_critic import ActorCriticConfig

CONFIG = TrainConfig(task="so101-lift", algo="sac", num_envs=16, total_steps=500_000,
                     sac=SACConfig(gamma=0.8, batch_size=256, utd=0.5, learning_starts=4_000, steps_per_iteration=16,
                                   buffer_size=1_000_000),
                     policy=ActorCriticConfig(actor_hidden=(256, 256), critic_hidden=(256, 256), activation="relu",
                                              normalize_obs=False),
                     checkpoint_every=100, eval_every=100, eval_episodes=64)
