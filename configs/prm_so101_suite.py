"""The VLAC-style process reward model on so101-suite datasets (pass --dataset DIR[,DIR...], e.g. a folder of the four
families' expert / noisy-high / mixed recipes written by `rlrobot collect --recipe`): state observations, the
instruction's cached sentence embedding. Sized for 2 shared CPU cores (a few minutes)."""

from rlrobot.algorithms.prm import PRMConfig
from rlrobot.config import train_config
from rlrobot.rewards.prm import PRMNetConfig

CONFIG = train_config("prm", task="so101-suite", num_envs=1, prm=PRMConfig(num_updates=5000, batch_size=256),
                      prm_net=PRMNetConfig(obs_keys=("state",)), eval_every=0, checkpoint_every=5, video=True,
                      update_threads=1)
