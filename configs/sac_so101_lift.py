"""SAC on so101-lift (dense reward, ee_delta control): the push preset's settings (not yet measured on lift)."""

import dataclasses

from rlrobot.configs.sac_so101_push import CONFIG as PUSH

CONFIG = dataclasses.replace(PUSH, task="so101-lift", total_steps=500_000, sac=dataclasses.replace(PUSH.sac),
                             policy=dataclasses.replace(PUSH.policy))
