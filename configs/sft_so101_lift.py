"""Few-shot SFT of the flow-matching chunk policy on so101-lift demonstrations (pass --dataset DIR).

The training env is only used for its spaces; evaluation runs eval_envs envs at the end.
"""

from rlrobot.algorithms.sft import SFTConfig
from rlrobot.config import train_config

CONFIG = train_config("sft", task="so101-lift", num_envs=1, sft=SFTConfig(num_updates=2000),
                      eval_episodes=64, checkpoint_every=10)
