"""LeRobot arms (SO-101 follower first) behind our ``Robot`` interface; lerobot is imported lazily.

Units. LeRobot reports and takes motor positions in normalised units per motor (``MotorNormMode``):
- ``degrees`` (SO follower default, ``use_degrees=True``): 0 in the middle of the calibrated range -> we use radians;
- ``range_m100_100``: -100..100 over the calibrated range [range_min, range_max] (raw ticks of a 4096-step encoder);
- ``range_0_100`` (the gripper): 0..100 over its calibrated range.
Our body joints are radians with 0 in the middle of each range, the same convention as LeRobot's calibration, so
degrees map by a factor, and a -100..100 value maps linearly onto the calibrated range in radians (physical angles).
The gripper's 0..100 is "closed" to "fully open" of the arm's own calibration; it maps onto the model gripper's range
[JOINT_LOW, JOINT_HIGH] (0 -> -0.17 rad, closed; 100 -> 1.75 rad, open), the same map the LeRobot profile uses
(``tasks/profile.py``): the model's closed target is 0..100's closed whatever the arm's calibrated width.

Cameras: ``cameras`` {name: spec} are configured on the follower (LeRobot's ``OpenCVCameraConfig``: index or path,
fps, width, height); its readings then carry each camera's HxWx3 uint8 RGB frame by that name.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from rlrobot.tasks.so101 import JOINT_HIGH, JOINT_LOW, JOINT_NAMES

from ..robot import check_control_rate

TICKS_PER_TURN = 4096  # STS3215 (the SO-101's servo) resolution
NORM_MODES = ("degrees", "range_m100_100", "range_0_100")


def _half_range_rad(calibration: dict[str, Any] | None, joint: int) -> tuple[float, float]:
    """(centre, half width) of a joint's calibrated range in radians; our model's limits without calibration."""
    if calibration is None:
        return 0.5 * (JOINT_LOW[joint] + JOINT_HIGH[joint]), 0.5 * (JOINT_HIGH[joint] - JOINT_LOW[joint])
    half = 0.5 * (calibration["range_max"] - calibration["range_min"]) * 2 * math.pi / TICKS_PER_TURN
    return 0.0, half


def to_radians(value: float, mode: str, joint: int, calibration: dict[str, Any] | None = None) -> float:
    if mode == "degrees":  # LeRobot: (ticks - mid) * 360 / 4095, while a true turn is 4096 ticks
        return math.radians(value) * (TICKS_PER_TURN - 1) / TICKS_PER_TURN
    if mode == "range_0_100":  # the arm's closed..open onto the model's: the calibration made it 0..100 already
        return JOINT_LOW[joint] + value / 100.0 * (JOINT_HIGH[joint] - JOINT_LOW[joint])
    centre, half = _half_range_rad(calibration, joint)
    if mode == "range_m100_100":
        return centre + value / 100.0 * half
    raise ValueError(f"norm mode {mode!r} is not one of {NORM_MODES}")


def from_radians(rad: float, mode: str, joint: int, calibration: dict[str, Any] | None = None) -> float:
    if mode == "degrees":
        return math.degrees(rad) * TICKS_PER_TURN / (TICKS_PER_TURN - 1)
    if mode == "range_0_100":
        return float(np.clip((rad - JOINT_LOW[joint]) / (JOINT_HIGH[joint] - JOINT_LOW[joint]) * 100.0, 0.0, 100.0))
    centre, half = _half_range_rad(calibration, joint)
    if mode == "range_m100_100":
        return float(np.clip((rad - centre) / half * 100.0, -100.0, 100.0))
    raise ValueError(f"norm mode {mode!r} is not one of {NORM_MODES}")


def parse_cameras(spec: str | None) -> dict[str, str]:
    """``front=0,wrist=/dev/video2`` -> {"front": "0", "wrist": "/dev/video2"} (one-line errors for bad input)."""
    if not spec:
        return {}
    out: dict[str, str] = {}
    for part in spec.split(","):
        name, sep, device = part.strip().partition("=")
        if not sep or not name or not device:
            raise ValueError(f"lerobot_cameras={spec!r}: each camera is NAME=INDEX_OR_PATH, comma-separated "
                             "(e.g. front=0,wrist=/dev/video2)")
        if not name.isidentifier():
            raise ValueError(f"lerobot_cameras: camera name {name!r} must be letters, digits and _")
        if name in out:
            raise ValueError(f"lerobot_cameras: camera {name!r} is given twice")
        out[name] = device
    return out


def camera_configs(cameras: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """LeRobot ``OpenCVCameraConfig`` objects of {name: {"device", "width", "height", "fps"}}."""
    from lerobot.cameras.opencv import OpenCVCameraConfig

    out = {}
    for name, spec in cameras.items():
        device = spec["device"]
        index_or_path = int(device) if str(device).isdigit() else Path(str(device))
        out[name] = OpenCVCameraConfig(index_or_path=index_or_path, fps=int(spec["fps"]), width=int(spec["width"]),
                                       height=int(spec["height"]))
    return out


class LeRobotArm:
    """Wraps a connected LeRobot ``Robot`` (``get_observation`` / ``send_action`` with ``<motor>.pos`` keys)."""

    joint_names = JOINT_NAMES
    joint_low = JOINT_LOW
    joint_high = JOINT_HIGH

    def __init__(self, port: str = "/dev/ttyACM0", robot_id: str = "rlrobot_so101", use_degrees: bool = True,
                 control_rate_hz: float = 25.0, context: dict[str, Any] | None = None, robot=None,
                 cameras: dict[str, dict[str, Any]] | None = None):
        """``cameras``: {name: {"device": index or path, "width", "height", "fps"}} to configure on the follower."""
        self.control_rate_hz = check_control_rate(control_rate_hz)  # the robot side owns its rate, bounded
        self.context = {k: np.asarray(v, np.float64) for k, v in (context or {}).items()}
        self._robot = robot
        self._config = {"port": port, "id": robot_id, "use_degrees": use_degrees}
        self.camera_specs = dict(cameras or {})
        self._last_qpos: np.ndarray | None = None
        self._last_time = 0.0

    def follower_config(self):
        """LeRobot's SO-101 follower config of this arm, cameras included (0.4.4+: ``so_follower``; older:
        ``so101_follower``)."""
        try:
            from lerobot.robots.so_follower import SO101FollowerConfig
        except ImportError:
            try:
                from lerobot.robots.so101_follower import SO101FollowerConfig
            except ImportError as e:
                raise ImportError("robot='lerobot' needs LeRobot with the SO-101 follower and the Feetech SDK: "
                                  "pip install 'rlrobot[lerobot]' 'lerobot[feetech]'") from e
        return SO101FollowerConfig(**self._config, cameras=camera_configs(self.camera_specs))

    def _build(self):
        config = self.follower_config()
        try:
            from lerobot.robots.so_follower import SO101Follower
        except ImportError:
            from lerobot.robots.so101_follower import SO101Follower
        return SO101Follower(config)

    @property
    def camera_names(self) -> tuple[str, ...]:
        return tuple(self.camera_specs)

    def _norm_modes(self) -> list[str]:
        motors = self._robot.bus.motors
        return [str(getattr(motors[name].norm_mode, "value", motors[name].norm_mode)) for name in JOINT_NAMES]

    def _calibration(self, name: str) -> dict[str, Any] | None:
        cal = getattr(self._robot, "calibration", None) or {}
        c = cal.get(name)
        return None if c is None else {"range_min": c.range_min, "range_max": c.range_max}

    def connect(self) -> None:
        if self._robot is None:
            self._robot = self._build()
        if not getattr(self._robot, "is_connected", False):
            self._robot.connect()
        self._modes = self._norm_modes()

    def observe(self) -> dict[str, Any]:
        """The arm's reading in radians. A missing or non-numeric joint value raises ValueError; whether the values
        are plausible is the safety supervisor's check, not the driver's."""
        raw = self._robot.get_observation()
        now = time.monotonic()
        missing = [f"{n}.pos" for n in JOINT_NAMES if f"{n}.pos" not in raw]
        if missing:
            raise ValueError(f"the arm's reading lacks {missing}")
        try:
            values = [float(raw[f"{n}.pos"]) for n in JOINT_NAMES]
        except (TypeError, ValueError) as e:
            raise ValueError(f"the arm's reading has a non-numeric joint value ({e})") from e
        qpos = np.array([to_radians(v, m, j, self._calibration(n))
                         for j, (n, m, v) in enumerate(zip(JOINT_NAMES, self._modes, values, strict=True))])
        # the bus reports no velocity: finite difference between readings
        qvel = np.zeros(6) if self._last_qpos is None else (qpos - self._last_qpos) / max(now - self._last_time, 1e-3)
        self._last_qpos, self._last_time = qpos, now
        images = {k: v for k, v in raw.items() if not k.endswith(".pos")}
        missing_frames = [name for name in self.camera_specs if name not in images]
        if missing_frames:
            raise ValueError(f"the arm's reading lacks the frames of cameras {missing_frames}")
        out = {"qpos": qpos, "qvel": qvel, "timestamp": now}
        if self.context:
            out["context"] = dict(self.context)
        if images:
            out["images"] = images
        return out

    def to_action(self, joint_targets: np.ndarray) -> dict[str, float]:
        return {f"{n}.pos": from_radians(float(q), m, j, self._calibration(n))
                for j, (n, m, q) in enumerate(zip(JOINT_NAMES, self._modes, joint_targets, strict=True))}

    def _send(self, joint_targets: np.ndarray) -> None:
        targets = np.asarray(joint_targets, np.float64)
        if targets.shape != (len(JOINT_NAMES),) or not np.isfinite(targets).all():  # never a NaN to a servo
            raise ValueError(f"joint targets must be {len(JOINT_NAMES)} finite radians, got {targets}")
        self._robot.send_action(self.to_action(targets))

    def act(self, joint_targets: np.ndarray) -> None:
        self._send(joint_targets)

    def hold(self, at: np.ndarray | None = None) -> None:
        """Hold at ``at`` (the supervisor's command). Without it there is no checked position to hold at: the driver
        never sends its last raw reading (it may be garbage); the caller disables instead."""
        if at is None:
            raise ValueError("hold needs the supervisor's command; without one, disable the arm")
        self._send(at)

    def disable(self) -> None:
        bus = getattr(self._robot, "bus", None)
        if bus is not None and hasattr(bus, "disable_torque"):
            bus.disable_torque()

    def disconnect(self) -> None:
        if self._robot is not None and getattr(self._robot, "is_connected", False):
            self._robot.disconnect()
