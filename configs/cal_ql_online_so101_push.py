"""Cal-QL online with the offline data kept on so101-push: the lift preset's settings (configs/cal_ql_online_so101_lift.py)."""

import dataclasses

from rlrobot.configs.cal_ql_online_so101_lift import CONFIG as LIFT

CONFIG = dataclasses.replace(LIFT, task="so101-push", cal_ql_online=dataclasses.replace(LIFT.cal_ql_online))
