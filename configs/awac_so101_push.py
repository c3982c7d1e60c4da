"""AWAC on so101-push from a LeRobotDataset (pass --dataset DIR, e.g. one written by `rlrobot collect --task
so101-push --recipe mixed --out DIR`).

CPU preset, sized as IQL's (configs/iql_so101_push.py): 64x64 MLPs (the reference code: 256-wide); 3,000 gradient
steps (rlkit's AWAC scripts: 25,000 or 50,000 offline steps before fine-tuning; CORL: 1M); gamma 0.9 (IQL's preset:
short credit assignment for the shaped per-step reward). The rest are AWAC's defaults: temperature lambda 1 (the
reference code's default), batch-normalised weights, twin critics, tau 0.005. Measured on the noisy datasets of
so101-push and so101-lift at this budget (3 seeds): lambda 1 succeeds 0.99 and 0.94, lambda 0.3 0.96 and 0.76,
lambda 0.1 (IQL's 1 / beta) 0.62 and 0.43. For a GPU: --awac.hidden 256 256 --awac.gradient-steps 1000000
--update-threads 0 --device cuda."""

from rlrobot.algorithms.awac import AWACConfig
from rlrobot.config import train_config

CONFIG = train_config("awac", task="so101-push", num_envs=1, update_threads=1, eval_episodes=32, eval_envs=16,
                      checkpoint_every=10,
                      awac=AWACConfig(gradient_steps=3000, batch_size=256, updates_per_iteration=500, hidden=(64, 64),
                                      lr=3e-4, gamma=0.9))
