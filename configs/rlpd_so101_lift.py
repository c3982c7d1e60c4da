"""RLPD on so101-lift (pass --dataset DIR, e.g. data/offline/so101-lift_noisy): random init, each batch half offline /
half online, 10 LayerNorm critics with a random target subset of 2, the actor on their mean. CPU preset, sized like
configs/wsrl_so101_lift.py for the comparison: 64x64 MLPs, UTD 0.5 (the paper: up to 20: --rlpd.utd 20 on a GPU),
batches of 256, 2,048 uniform-random env steps before the first update, gamma 0.97 (sparse rewards)."""

from rlrobot.algorithms.wsrl import RLPDConfig
from rlrobot.config import train_config
from rlrobot.policies.sac_policy import SACPolicyConfig

CONFIG = train_config("rlpd", task="so101-lift", num_envs=16, total_steps=22_528, update_threads=1,
                      rlpd=RLPDConfig(gamma=0.97, utd=0.5, batch_size=256, learning_starts=2_048, rollout_steps=16,
                                      buffer_size=200_000, num_target_critics=2, actor_q="mean", offline_ratio=0.5),
                      policy=SACPolicyConfig(actor_hidden=(64, 64), critic_hidden=(64, 64), activation="relu",
                                            normalize_obs=True, num_critics=10, critic_layer_norm=True),
                      checkpoint_every=8, eval_every=8, eval_episodes=64, eval_envs=32)
