"""A fake LeRobot SO-101 follower (the object ``LeRobotArm`` wraps: ``get_observation`` / ``send_action`` with
``<motor>.pos`` keys in degrees, ``bus.disable_torque``) with a simple servo model and injectable reading faults.
Every command it receives is kept with its wall time, for the tests to check."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from types import SimpleNamespace

import numpy as np

from rlrobot.real_robot.drivers.lerobot import LeRobotArm, to_radians
from rlrobot.real_robot.safety import STS3215_MAX_VELOCITY
from rlrobot.tasks.so101 import JOINT_HIGH, JOINT_LOW, JOINT_NAMES

DEG_PER_RAD = 180.0 / math.pi
START = np.array([0.0, 0.45, -0.3, 0.2, 0.0, 0.5])  # rad, inside every joint's limits (shoulder_lift at ~26 deg)

FAULTS = ("none", "garbage", "nan", "inf", "stale", "frozen", "glitch", "missing")
DRIFT_DEG_PER_TICK = 10.8  # the speed a servo reaches in one 25 Hz tick: a lie that a per-tick speed check passes


def corrupt(fault: str, raw: dict, frozen: dict | None, ticks: int = 0) -> dict:
    """The reading ``raw`` (degrees) as the fault makes it, ``ticks`` readings into the fault."""
    raw = dict(raw)
    if fault == "drift":  # shoulder_lift read moving away on its own, whatever the commands say
        raw["shoulder_lift.pos"] = frozen["shoulder_lift.pos"] + DRIFT_DEG_PER_TICK * (ticks + 1)
    elif fault == "garbage":
        raw["shoulder_lift.pos"] = 1e6
    elif fault == "nan":
        raw["elbow_flex.pos"] = float("nan")
    elif fault == "inf":
        raw["wrist_flex.pos"] = float("-inf")
    elif fault in ("stale", "frozen"):  # the bus keeps answering the same values while the arm is commanded on
        raw = dict(frozen)
    elif fault == "glitch":  # one tick 90 degrees off
        raw["shoulder_pan.pos"] += 90.0
    elif fault == "missing":
        del raw["wrist_roll.pos"]
    return raw


class FakeSO101:
    """Servo model: each reading, every joint has moved towards its goal by at most the STS3215's speed times the
    time since the last reading (control period ``dt``: simulated time, so the tests do not depend on the load)."""

    def __init__(self, dt: float = 0.04, start: np.ndarray = START, fault: str = "none", fault_from: int = 10**9,
                 fault_ticks: int = 10**9, on_read: Callable[[int], None] | None = None):
        self.dt, self.fault, self.fault_from, self.fault_ticks = dt, fault, fault_from, fault_ticks
        self.position = np.asarray(start, np.float64).copy()
        self.goal = self.position.copy()
        self.bus = SimpleNamespace(motors={n: SimpleNamespace(norm_mode="degrees") for n in JOINT_NAMES},
                                   disable_torque=self._disable)
        self.calibration = {}
        self.is_connected = True
        self.reads = 0
        self.sent: list[tuple[float, np.ndarray]] = []  # (wall time, joint targets in rad as the servo got them)
        self.raw_sent: list[dict] = []
        self.disabled_at: float | None = None
        self.on_read = on_read
        self._frozen: dict | None = None
        self.lock = threading.Lock()

    def connect(self) -> None:
        self.is_connected = True

    def disconnect(self) -> None:
        self.is_connected = False

    def _disable(self) -> None:
        if self.disabled_at is None:
            self.disabled_at = time.monotonic()

    def get_observation(self) -> dict:
        with self.lock:
            if self.on_read is not None:
                self.on_read(self.reads)
            step = STS3215_MAX_VELOCITY * self.dt
            if self.disabled_at is None:
                self.position += np.clip(self.goal - self.position, -step, step)
            raw = {f"{n}.pos": float(q * DEG_PER_RAD * 4096 / 4095) for n, q in zip(JOINT_NAMES, self.position, strict=True)}
            k, self.reads = self.reads, self.reads + 1
            if self.fault_from <= k < self.fault_from + self.fault_ticks:
                return corrupt(self.fault, raw, self._frozen, k - self.fault_from)
            self._frozen = raw
            return raw

    def send_action(self, action: dict) -> dict:
        with self.lock:
            self.raw_sent.append(dict(action))
            q = np.array([to_radians(float(action[f"{n}.pos"]), "degrees", j) for j, n in enumerate(JOINT_NAMES)])
            self.sent.append((time.monotonic(), q))
            if self.disabled_at is None:
                self.goal = q
            return action


def fake_arm(rate_hz: float = 25.0, **fault) -> tuple[LeRobotArm, FakeSO101]:
    fake = FakeSO101(dt=1.0 / rate_hz, **fault)
    arm = LeRobotArm(robot=fake, control_rate_hz=rate_hz, context={"target": np.array([0.2, 0.0, 0.1])})
    arm.connect()
    return arm, fake


def commands_within_limits(fake: FakeSO101, margin: float) -> tuple[int, int]:
    """(commands outside the joint limits + margin, commands with a non-finite value) the servos received."""
    outside = nonfinite = 0
    for _, q in fake.sent:
        nonfinite += not np.isfinite(q).all()
        outside += bool(((q < JOINT_LOW - margin - 1e-9) | (q > JOINT_HIGH + margin + 1e-9)).any())
    for action in fake.raw_sent:
        nonfinite += not all(math.isfinite(float(v)) for v in action.values())
    return outside, nonfinite
