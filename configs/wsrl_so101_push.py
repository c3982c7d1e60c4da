"""WSRL on so101-push: the lift preset's settings (see configs/wsrl_so101_lift.py)."""

import dataclasses

from rlrobot.configs.wsrl_so101_lift import CONFIG as LIFT

CONFIG = dataclasses.replace(LIFT, task="so101-push", wsrl=dataclasses.replace(LIFT.wsrl))
