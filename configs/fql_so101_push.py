"""FQL on so101-push from an offline dataset (pass --dataset DIR, e.g. `rlrobot collect --task so101-push --recipe noisy`).

CPU preset: 2 x 256 MLPs, batch 256, one torch thread for the updates (more are slower on a shared CPU). The paper
uses 4 x 512: on a GPU pass `--fql.hidden 512 512 512 512 --update-threads 0`, or use ``PAPER`` below. alpha 300 is
the paper's value for OGBench's cube / scene manipulation (its default 10 is for locomotion); the other settings are
the reference defaults (F = 10 flow steps, tau 0.005, mean of the two critics)."""

import dataclasses

from rlrobot.algorithms.fql import FQLConfig
from rlrobot.config import train_config

CONFIG = train_config("fql", task="so101-push", num_envs=1,
                      fql=FQLConfig(gradient_steps=100_000, batch_size=256, hidden=(256, 256), alpha=300.0,
                                    updates_per_iteration=1000),
                      eval_every=10, eval_episodes=64, eval_envs=32, checkpoint_every=10, update_threads=1)

PAPER = dataclasses.replace(CONFIG, fql=dataclasses.replace(CONFIG.fql, hidden=(512, 512, 512, 512), gradient_steps=1_000_000))
"""the paper's network size and budget (1M steps), for a GPU: ``--device cuda``"""
