"""Presets: one module per task x algorithm (``<algo>_<task>.py``) defining ``CONFIG = train_config(algo, ...)``.

``preset(task, algo)`` returns a fresh copy; a suite family (``so101-pick-place``, ...) without its own preset takes
the ``so101-suite`` preset of that algorithm (same scene, policy and observation); other pairs without a preset get the
algorithm's defaults for that task.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib

from rlrobot.config import TrainConfig, train_config


def module_name(task: str, algo: str) -> str:
    return f"{algo}_{task}".replace("-", "_").replace(":", "_").replace(".", "_").lower()


def _preset_module(task: str, algo: str):
    try:
        return importlib.import_module(f"rlrobot.configs.{module_name(task, algo)}")
    except ModuleNotFoundError:
        return None


def preset(task: str = "so101-reach", algo: str = "ppo") -> TrainConfig:
    from rlrobot.tasks.so101_suite import FAMILIES

    mod = _preset_module(task, algo)
    if mod is not None:
        return copy.deepcopy(mod.CONFIG)
    suite = _preset_module("so101-suite", algo) if task in {f"so101-{f}" for f in FAMILIES} else None
    if suite is not None:
        return dataclasses.replace(copy.deepcopy(suite.CONFIG), task=task)
    return train_config(algo, task=task)
