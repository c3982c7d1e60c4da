"""Presets: one module per task x algorithm (``<algo>_<task>.py``) defining ``CONFIG = train_config(algo, ...)``.

``preset(task, algo)`` returns a fresh copy; pairs without a preset get the algorithm's defaults for that task.
"""

from __future__ import annotations

import copy
import importlib

from rlrobot.config import TrainConfig, train_config


def module_name(task: str, algo: str) -> str:
    return f"{algo}_{task}".replace("-", "_").replace(":", "_").replace(".", "_").lower()


def preset(task: str = "so101-reach", algo: str = "ppo") -> TrainConfig:
    try:
        mod = importlib.import_module(f"rlrobot.configs.{module_name(task, algo)}")
    except ModuleNotFoundError:
        return train_config(algo, task=task)
    return copy.deepcopy(mod.CONFIG)
