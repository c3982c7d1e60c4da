"""Robot drivers: ``twin`` (MuJoCo digital twin) and ``lerobot`` (LeRobot's arms, SO-101 first)."""

from __future__ import annotations

from typing import Any

DRIVERS = ("twin", "lerobot")


def make_robot(kind: str, **options: Any):
    if kind == "twin":
        from .twin import TwinRobot

        return TwinRobot(**options)
    if kind == "lerobot":
        from .lerobot import LeRobotArm

        return LeRobotArm(**options)
    raise ValueError(f"robot={kind!r} is not one of {DRIVERS}")
