"""f-DVL on so101-push from a LeRobotDataset (pass --dataset DIR, e.g. one written by `rlrobot collect --task
so101-push --recipe mixed --out DIR`).

CPU preset, sized as IQL's (configs/iql_so101_push.py): 64x64 MLPs, 3,000 gradient steps, gamma 0.9, beta 10 (the
per-step rewards are in [0, 1]); the paper's chi-square divergence with one uniform action per state in the value's
batch (the reference's locomotion command). For a GPU: --f-dvl.hidden 256 256 --f-dvl.gradient-steps 1000000
--f-dvl.batch-size 1024 --f-dvl.actor-cosine-decay --update-threads 0 --device cuda."""

from rlrobot.algorithms.fdvl import FDVLConfig
from rlrobot.config import train_config

CONFIG = train_config("f-dvl", task="so101-push", num_envs=1, update_threads=1, eval_episodes=32, eval_envs=16,
                      checkpoint_every=10,
                      f_dvl=FDVLConfig(gradient_steps=3000, batch_size=256, updates_per_iteration=500, hidden=(64, 64),
                                       lr=3e-4, gamma=0.9, beta=10.0, divergence="chi-square"))
