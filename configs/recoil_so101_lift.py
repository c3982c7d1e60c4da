"""ReCOIL on so101-lift (pass --dataset DIR and --recoil.expert-dataset DIR); the CPU preset of so101-push (see there)."""

import dataclasses

from rlrobot.configs.recoil_so101_push import CONFIG as PUSH

CONFIG = dataclasses.replace(PUSH, task="so101-lift")
