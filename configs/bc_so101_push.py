"""Gaussian-MLP behaviour cloning on so101-push from a LeRobotDataset (pass --dataset DIR, e.g. one written by
`rlrobot collect --task so101-push --recipe noisy --out DIR`).

CPU preset (the offline table of the README was measured with it on a shared 2-core machine): 64x64 MLPs, 3,000
gradient steps of 256 transitions, torch on one thread for the updates (several threads were 5-10x slower there).
For a GPU: --bc.hidden 256 256 --bc.gradient-steps 100000 --update-threads 0 --device cuda."""

from rlrobot.algorithms.bc import BCConfig
from rlrobot.config import train_config

CONFIG = train_config("bc", task="so101-push", num_envs=1, update_threads=1, eval_episodes=32, eval_envs=16,
                      checkpoint_every=10,
                      bc=BCConfig(gradient_steps=3000, batch_size=256, updates_per_iteration=500, hidden=(64, 64),
                                  lr=1e-3, gamma=0.9))
