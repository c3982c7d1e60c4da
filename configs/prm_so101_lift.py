"""The VLAC-style process reward model on so101-lift datasets (pass --dataset DIR[,DIR...], e.g. the expert, noisy,
noisy-high and mixed recipes of `rlrobot collect --recipe`): state MLP, time progress for successes, the task's dense
progress for failures (all kept: ``--prm.no-filter-failures``), and ``--prm.after-success track``: a frame after the
first success is 1 only while the cube is still held up (the noisy recipes drop it after the lift; labelled 1, those
frames taught the model that a dropped cube beside a wide-open jaw is finished, and PPO learned to drop it).
Its use: ``rlrobot train --algo ppo --task so101-lift --reward-mode sparse --reward.shaping prm:RUN
--reward.prm.mode progress --reward.prm.scale 0.5`` (PPO from scratch on success only; README, RL from learned
rewards). About 3 minutes on one core."""

from rlrobot.algorithms.progress_model import PRMConfig
from rlrobot.config import train_config

CONFIG = train_config("prm", task="so101-lift", prm=PRMConfig(num_updates=3000, filter_failures=False,
                                                              after_success="track"), update_threads=1)
