"""BC on the union of --dataset and the expert demonstrations (--bc-union.expert-dataset DIR): ReCOIL's baseline on
so101-push, with ReCOIL's preset's data (10 expert episodes) and BC's preset otherwise (configs/bc_so101_push.py)."""

import dataclasses

from rlrobot.algorithms.recoil import BCUnionConfig
from rlrobot.config import train_config
from rlrobot.configs.bc_so101_push import CONFIG as BC

CONFIG = train_config("bc-union", task="so101-push", num_envs=1, update_threads=BC.update_threads,
                      eval_episodes=BC.eval_episodes, eval_envs=BC.eval_envs, checkpoint_every=BC.checkpoint_every,
                      bc_union=BCUnionConfig(**{f.name: getattr(BC.bc, f.name) for f in dataclasses.fields(BC.bc)},
                                             expert_episodes=10))
