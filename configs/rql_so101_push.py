"""Reversal Q-learning on so101-push from an offline dataset (pass --dataset DIR): the reference's manipulation
settings (h 5, rho 0.5, expectile 0.7, alpha 3, 10 flow steps) at CPU size (2 x 256 MLPs, 4 value members, EMA 0.99,
one update thread); ``PAPER`` below is the paper's size for a GPU. Why each change: docs/algorithms/rql.md."""

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
