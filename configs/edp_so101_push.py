"""EDP on so101-push from a LeRobotDataset (pass --dataset DIR, e.g. one written by `rlrobot collect --task
so101-push --recipe mixed --out DIR`).

CPU preset, the budget of IQL's (configs/iql_so101_push.py: 3,000 gradient steps, gamma 0.9, beta 10 for the
per-step rewards in [0, 1], expectile 0.7) with the IQL objective, the paper's main pairing. The diffusion actor and
the critics are 128x128 (the reference: a 3 x 256 actor, 2 x 256 critics); K = 1,000 diffusion steps and 15
DPM-Solver steps, 50 candidate actions picked by softmax(Q) at evaluation, as the reference. For a GPU:
--edp.hidden 256 256 256 --edp.gradient-steps 1000000 --update-threads 0 --device cuda."""

from rlrobot.algorithms.edp import EDPConfig
from rlrobot.config import train_config

CONFIG = train_config("edp", task="so101-push", num_envs=1, update_threads=1, eval_episodes=32, eval_envs=16,
                      checkpoint_every=10,
                      edp=EDPConfig(gradient_steps=3000, batch_size=256, updates_per_iteration=500, hidden=(128, 128),
                                    lr=3e-4, gamma=0.9, expectile=0.7, beta=10.0))
