"""Cal-QL on so101-push from a LeRobotDataset (pass --dataset DIR, e.g. one written by `rlrobot collect --task
so101-push --recipe mixed --out DIR`).

CPU preset (the offline table of the README was measured with it on a shared 2-core machine): 64x64 MLPs (the paper:
256x256 or larger), 3,000 gradient steps, 4 sampled actions per state in the regulariser (the paper: 10; each costs
3 critic passes per state), gamma 0.9 as IQL's preset, conservative weight 2 (rewards in [0, 1] per step; not tuned). For a GPU:
--cal-ql.hidden 256 256 --cal-ql.num-actions 10 --cal-ql.gradient-steps 1000000 --update-threads 0 --device cuda."""

from rlrobot.algorithms.cal_ql import CalQLConfig
from rlrobot.config import train_config

CONFIG = train_config("cal-ql", task="so101-push", num_envs=1, update_threads=1, eval_episodes=32, eval_envs=16,
                      checkpoint_every=10,
                      cal_ql=CalQLConfig(gradient_steps=3000, batch_size=256, updates_per_iteration=500, hidden=(64, 64),
                                         lr=3e-4, actor_lr=1e-4, gamma=0.9, cql_alpha=2.0, num_actions=4))
