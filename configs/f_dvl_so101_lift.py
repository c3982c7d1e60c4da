"""f-DVL on so101-lift (pass --dataset DIR); the CPU preset of so101-push (see there)."""

import dataclasses

from rlrobot.configs.f_dvl_so101_push import CONFIG as PUSH

CONFIG = dataclasses.replace(PUSH, task="so101-lift")
