"""IQL on so101-push from a LeRobotDataset (pass --dataset DIR, e.g. one written by `rlrobot collect --task
so101-push --recipe mixed --out DIR`).

CPU preset (the offline table of the README was measured with it on a shared 2-core machine): 64x64 MLPs (the paper:
2x256), 3,000 gradient steps (the paper: 1M), gamma 0.9 (short credit assignment for the shaped per-step reward, as
SAC's 0.8 on this task; fewer steps to propagate values), beta 10 (the per-step rewards are in [0, 1], so advantages
are small and locomotion's beta 3 would keep the weights near 1; not tuned), expectile 0.7. For a GPU: --iql.hidden 256 256
--iql.gradient-steps 1000000 --update-threads 0 --device cuda."""

from rlrobot.algorithms.iql import IQLConfig
from rlrobot.config import train_config

CONFIG = train_config("iql", task="so101-push", num_envs=1, update_threads=1, eval_episodes=32, eval_envs=16,
                      checkpoint_every=10,
                      iql=IQLConfig(gradient_steps=3000, batch_size=256, updates_per_iteration=500, hidden=(64, 64),
                                    lr=3e-4, gamma=0.9, expectile=0.7, beta=10.0))
