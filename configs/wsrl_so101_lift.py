"""WSRL on so101-lift (pass --init RUN_DIR of an --algo cal-ql run; architecture, discount, target subset and actor
reduction come from it). CPU preset: 16 envs x 16 steps per iteration, a 2,048-step warm-up with the frozen init
policy, then SAC at UTD 0.5 with batches of 256 (the paper: UTD 4, a 5,000-step warm-up, on a GPU). Results entry:
warm-start-so101-lift-sparse (its Cal-QL pretraining command is in docs/algorithms/wsrl.md)."""

from rlrobot.algorithms.wsrl import WSRLConfig
from rlrobot.config import train_config

CONFIG = train_config("wsrl", task="so101-lift", num_envs=16, total_steps=22_528, update_threads=1,
                      wsrl=WSRLConfig(utd=0.5, batch_size=256, learning_starts=2_048, rollout_steps=16,
                                      buffer_size=200_000),
                      checkpoint_every=8, eval_every=8, eval_episodes=64, eval_envs=32)
