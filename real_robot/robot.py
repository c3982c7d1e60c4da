"""The robot interface every driver speaks (the MuJoCo twin, LeRobot's arms), in SI units.

Joint positions are radians in our joint order (the SO-101's: shoulder_pan, shoulder_lift, elbow_flex, wrist_flex,
wrist_roll, gripper), zero in the middle of each range as in LeRobot's calibration. ``observe`` returns a dict:

- ``qpos`` float64 [n_joints] (rad), ``qvel`` float64 [n_joints] (rad/s, estimated where the hardware has none);
- ``timestamp`` (``time.monotonic()`` of the reading);
- ``images`` {camera name: HxWx3 uint8} when the robot has cameras (by the names configured on it; the LeRobot
  profile's bridge crops and resizes them with ``rlrobot.tasks.profile.prepare_frames``, as in training);
- ``context`` {name: array}, only where something knows the task: a real arm's comes from the user (``--target``),
  the sighted twin reports the target and the cube pose; the blind twin (the LeRobot profile) and a real arm without
  user input report none, and a policy that needs one is refused (``observation_check``);
- ``instruction`` (optional): the task the operator set up, in words (the blind twin reports its episode's).
"""

from __future__ import annotations

import math
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
        """Hold: command ``at`` (the supervisor's braking command, rad). Without it a driver refuses (ValueError):
        a raw reading is never sent back to the motors; an emergency stop without a checked position disables."""
        ...

    def disable(self) -> None:
        """Torque off (or the closest safe equivalent): the end of an aborted episode or an e-stop."""
        ...

    def disconnect(self) -> None: ...


CONTROL_RATE_RANGE_HZ = (1.0, 200.0)
"""the robot side's control rate: below 1 Hz a command lasts seconds (and so would the per-command motion budget);
above 200 Hz the SO-101's serial bus cannot read and write six servos in one period"""


def check_control_rate(rate_hz: Any, name: str = "control_rate_hz") -> float:
    """The rate as a float, or a one-line ValueError naming the field and the allowed range."""
    low, high = CONTROL_RATE_RANGE_HZ
    if isinstance(rate_hz, bool) or not isinstance(rate_hz, (int, float)) or not math.isfinite(rate_hz) \
            or not low <= rate_hz <= high:
        raise ValueError(f"{name}={rate_hz!r} must be a number in [{low:g}, {high:g}] Hz")
    return float(rate_hz)
