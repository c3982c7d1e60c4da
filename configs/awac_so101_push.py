"""AWAC on so101-push from a LeRobotDataset (pass --dataset DIR, e.g. one written by `rlrobot collect --task
so101-push --recipe mixed --out DIR`). CPU-sized as IQL's preset: 64x64 MLPs, 3,000 gradient steps, gamma 0.9; the rest
AWAC's defaults (lambda 1). For a GPU: --awac.hidden 256 256 --awac.gradient-steps 1000000 --device cuda."""

from rlrobot.algorithms.awac import AWACConfig
from rlrobot.config import train_config

CONFIG = train_config("awac", task="so101-push", num_envs=1, update_threads=1, eval_episodes=32, eval_envs=16,
                      checkpoint_every=10,
                      awac=AWACConfig(gradient_steps=3000, batch_size=256, updates_per_iteration=500, hidden=(64, 64),
                                      lr=3e-4, gamma=0.9))
