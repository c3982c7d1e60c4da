"""WSRL on so101-lift (pass --init RUN_DIR of an --algo cal-ql run; the architecture, discount, target subset and
actor reduction come from it). CPU preset: 16 envs x 16 steps per iteration, a warm-up of 2,048 env steps with the frozen
init policy (the paper: 5,000 of a 250k+ budget), then SAC at UTD 0.5 with batches of 256 (the paper: UTD 4, i.e. 4
critic steps on minibatches of 256 and one actor step per env step: --wsrl.utd 4 --wsrl.learning-starts 5000 on a GPU),
an evaluation every 2,048 env steps.

The measured comparison (results entry warm-start-so101-lift-sparse) pretrains Cal-QL with the sparse reward and a
REDQ ensemble of 10 LayerNorm critics:
rlrobot train --algo cal-ql --task so101-lift --reward-mode sparse --dataset data/offline/so101-lift_noisy
  --cal-ql.num-critics 10 --cal-ql.num-target-critics 2 --cal-ql.critic-layer-norm --cal-ql.actor-q mean
  --cal-ql.gamma 0.97 --cal-ql.gradient-steps 4000 --out runs/wsrl/calql_lift_s0
rlrobot train --algo wsrl --task so101-lift --reward-mode sparse --init runs/wsrl/calql_lift_s0"""

from rlrobot.algorithms.wsrl import WSRLConfig
from rlrobot.config import train_config

CONFIG = train_config("wsrl", task="so101-lift", num_envs=16, total_steps=22_528, update_threads=1,
                      wsrl=WSRLConfig(utd=0.5, batch_size=256, learning_starts=2_048, rollout_steps=16,
                                      buffer_size=200_000),
                      checkpoint_every=8, eval_every=8, eval_episodes=64, eval_envs=32)
