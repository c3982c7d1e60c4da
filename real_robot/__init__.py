"""Sim-to-real: policy server / client, safety supervisor, chunk executor, recorder, robot drivers (twin, LeRobot)."""

from .robot import Robot
from .safety import SafetyConfig, SafetySupervisor

__all__ = ["Robot", "SafetyConfig", "SafetySupervisor"]
