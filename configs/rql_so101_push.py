"""Reversal Q-learning on so101-push from an offline dataset (pass --dataset DIR, e.g. `rlrobot collect --task
so101-push --recipe noisy`).

The reference's manipulation settings (OGBench cube / scene / puzzle): chunks of h = 5 actions, ensemble pessimism
rho 0.5, expectile 0.7, alpha 3 (scene's), F = 10 flow steps. EMA actor decay 0.99, not the paper's 0.999: that
averages over ~1,000 steps, so at CPU budgets of a few thousand steps the acting actor would still carry much of its
random initialisation (0.999^1000 = 0.37; a 1,000-step pilot on so101-push noisy succeeded in 3 % of episodes).
CPU preset: 2 x 256 MLPs and 4 value members instead of 4 x 512 and 10 (an update costs ~2.5x less), one torch
thread for the updates. ``PAPER`` below (or `--rql.hidden 512 512 512 512 --rql.num-values 10 --rql.ema 0.999
--update-threads 0`) is the paper's size, for a GPU."""

import dataclasses

from rlrobot.algorithms.rql import RQLConfig
from rlrobot.config import train_config

CONFIG = train_config("rql", task="so101-push", num_envs=1,
                      rql=RQLConfig(gradient_steps=100_000, batch_size=256, hidden=(256, 256), num_values=4, horizon=5,
                                    alpha=3.0, expectile=0.7, rho=0.5, ema=0.99,
                                    updates_per_iteration=1000),
                      eval_every=10, eval_episodes=64, eval_envs=32, checkpoint_every=10, update_threads=1)

PAPER = dataclasses.replace(CONFIG, rql=dataclasses.replace(CONFIG.rql, hidden=(512, 512, 512, 512), num_values=10,
                                                            ema=0.999, gradient_steps=1_000_000))
"""the paper's network and ensemble size and budget (1M steps), for a GPU: ``--device cuda``"""
