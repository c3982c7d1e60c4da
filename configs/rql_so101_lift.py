"""Reversal Q-learning on so101-lift from an offline dataset (pass --dataset DIR); the so101-push preset's settings
(see there)."""

import dataclasses

from rlrobot.configs.rql_so101_push import CONFIG as PUSH
from rlrobot.configs.rql_so101_push import PAPER as PUSH_PAPER

CONFIG = dataclasses.replace(PUSH, task="so101-lift")
PAPER = dataclasses.replace(PUSH_PAPER, task="so101-lift")
