"""BC on the union of --dataset and the expert demonstrations on so101-lift; the preset of so101-push (see there)."""

import dataclasses

from rlrobot.configs.bc_union_so101_push import CONFIG as PUSH

CONFIG = dataclasses.replace(PUSH, task="so101-lift")
