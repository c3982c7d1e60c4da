"""Few-shot SFT of the flow-matching chunk policy on so101-push demonstrations (pass --dataset DIR)."""

import dataclasses

from rlrobot.configs.sft_so101_lift import CONFIG as LIFT

CONFIG = dataclasses.replace(LIFT, task="so101-push")
