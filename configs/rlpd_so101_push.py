"""RLPD on so101-push: the lift preset's settings (see configs/rlpd_so101_lift.py)."""

import dataclasses

from rlrobot.configs.rlpd_so101_lift import CONFIG as LIFT

CONFIG = dataclasses.replace(LIFT, task="so101-push", rlpd=dataclasses.replace(LIFT.rlpd),
                             policy=dataclasses.replace(LIFT.policy))
