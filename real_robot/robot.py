"""The robot interface every driver speaks (the MuJoCo twin, LeRobot's arms), in SI units.

Joint positions are radians in our joint order (the SO-101's: shoulder_pan, shoulder_lift, elbow_flex, wrist_flex,
wrist_roll, gripper), zero in the middle of each range as in LeRobot's calibration. ``observe`` returns a dict:

- ``qpos`` float64 [n_joints] (rad), ``qvel`` float64 [n_joints] (rad/s, estimated where the hardware has none);
- ``timestamp`` (``time.monotonic()`` of the reading);
- ``images`` {camera name: HxWx3 uint8} when the robot has cameras;
- ``context`` {name: array}: what perception knows of the task (the twin reports the target and the cube pose;
  on a real arm it comes from the user or a perception module).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Robot(Protocol):
    joint_names: tuple[str, ...]
    joint_low: np.ndarray
    joint_high: np.ndarray
    control_rate_hz: float

    def connect(self) -> None: ...

    def observe(self) -> dict[str, Any]: ...

    def act(self, joint_targets: np.ndarray) -> None:
        """Command joint position targets (rad); the safety supervisor has already checked them."""
        ...

    def hold(self, at: np.ndarray | None = None) -> None:
        """Hold: command ``at`` (the supervisor's braking command, rad), or with no argument (an emergency stop) the
        current measured position."""
        ...

    def disable(self) -> None:
        """Torque off (or the closest safe equivalent): the end of an aborted episode or an e-stop."""
        ...

    def disconnect(self) -> None: ...
