"""Safety supervisor: sits between any policy and any robot; nothing reaches the motors without passing it.

Per command: NaN/Inf or wrong-shape targets are refused; the target is clamped to the joint limits; then the step
from the last command is clamped to a window that keeps *every* emitted step within the velocity limit (|step| <=
v dt) and the acceleration limit (|step - previous step| <= a dt^2), and that leaves room to brake to rest before a
joint limit. Refusals (non-finite targets, a TCP outside the workspace box) and holds brake at the acceleration
limit instead of stopping dead, so they never violate it either. The first command of an episode starts from the
*measured* position at rest, even when a reading lies outside the joint limits (readings are not clipped): the
arm then moves back inside at the same rates, never jumps to the limit.

A watchdog turns "no fresh action" into hold, then disable. The supervisor has one latch: an e-stop (from code, a
signal or a key), a watchdog disable or a control-loop fault sets it, ``filter``/``stop`` refuse while it is set,
and only ``clear_estop`` (an operator's deliberate act) clears it. Every intervention is counted and logged.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

log = logging.getLogger("rlrobot.safety")

WATCHDOG_STATES = ("ok", "hold", "disable")


class SafetyLatched(RuntimeError):
    """A command was asked for while the supervisor is latched (e-stop, watchdog disable or fault)."""


def _positive_finite(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"safety.{name}={value!r} must be a finite number > 0")


# Defaults from the SO-101's servos, the Feetech STS3215 (all six joints of the LeRobot follower, gear 1/345):
# - speed: no-load 0.222 s / 60 deg at 7.4 V (the 12 V C018 measures the same 45-46 rpm) = 4.7 rad/s. The arm cannot
#   turn faster, so a faster command only lets the target run ahead of the arm;
# - acceleration: LeRobot's SO-101 follower writes Acceleration = 254 to every servo at connect
#   (FeetechMotorsBus.configure_motors), in units of 100 steps/s^2 of a 4096-step turn: 25400 steps/s^2 = 39 rad/s^2,
#   the ramp the servo itself follows (the register's largest value short of 0 = no ramp).
# The old defaults (6 rad/s, 150 rad/s^2) were above both; at 25 Hz they allowed 0.24 rad of step change per tick.
STS3215_MAX_VELOCITY = 4.7
STS3215_MAX_ACCELERATION = 39.0
ENCODER_STEP = 2 * math.pi / 4096
"""one count of the STS3215's 12-bit encoder (rad): a clamp smaller than this is applied but not counted as an
intervention (the servo cannot resolve it; e.g. the braking window shaves ~1e-5 rad off a step that ends at a joint
limit)"""
LATCH_KINDS = ("estop", "watchdog_disable", "fault", "latch")
"""interventions that latch the supervisor: logged as warnings (the others, per-step clamps, at debug level)"""


def braking_reach(distance: np.ndarray, max_change: float) -> np.ndarray:
    """Largest step towards a boundary ``distance`` away after which the arm can still brake to rest before it
    at the acceleration limit (conservative: the braking distance of a step s is at most s^2 / (2 a dt^2))."""
    return max_change * (np.sqrt(1.0 + 2.0 * np.maximum(distance, 0.0) / max_change) - 1.0)


def step_window(last: np.ndarray, prev: np.ndarray, max_step: float, max_change: float, joint_low: np.ndarray,
                joint_high: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[lo, hi] of the next command's step from the last command ``last`` (the one before it: ``prev``): velocity
    (``max_step`` per control step) and acceleration (``max_change`` per step squared) limits, and room to brake before
    the joint limits; the kinematic limits always win (from an inconsistent state an overshoot is then unavoidable).
    One arm ``[J]`` or a batch ``[N, J]``: the supervisor's window, and the simulated tasks' ``servo_limits``."""
    velocity = last - prev
    acc_lo = np.maximum(-max_step, velocity - max_change)
    acc_hi = np.minimum(max_step, velocity + max_change)
    lo = np.minimum(np.maximum(acc_lo, -braking_reach(last - joint_low, max_change)), acc_hi)
    hi = np.maximum(np.minimum(acc_hi, braking_reach(joint_high - last, max_change)), acc_lo)
    return lo, np.maximum(hi, lo)


@dataclass
class SafetyConfig:
    max_joint_velocity: float = STS3215_MAX_VELOCITY
    """rad/s per joint; a command further than velocity x dt from the previous one is clamped.
    Default: the SO-101's STS3215 servo at full speed (no-load 0.222 s/60 deg = 4.7 rad/s)"""
    max_joint_acceleration: float = STS3215_MAX_ACCELERATION
    """rad/s^2 per joint (a change of per-step velocity above acceleration x dt^2 is clamped).
    Default: the ramp LeRobot sets on the SO-101's STS3215 servos (Acceleration register 254 x 100 steps/s^2 = 39 rad/s^2)"""
    workspace_low: tuple[float, float, float] | None = None
    """TCP box corner (m, robot base frame); targets whose TCP leaves the box are refused"""
    workspace_high: tuple[float, float, float] | None = None
    watchdog_s: float = 0.25
    """no fresh action for this long -> hold position"""
    disable_after_s: float = 1.0
    """no fresh action for this long -> disable (torque off), abort the episode and latch until an operator clears it"""

    def __post_init__(self):
        for name in ("max_joint_velocity", "max_joint_acceleration", "watchdog_s", "disable_after_s"):
            _positive_finite(name, getattr(self, name))
        if (self.workspace_low is None) != (self.workspace_high is None):
            raise ValueError("safety.workspace_low and safety.workspace_high must be given together")
        for name in ("workspace_low", "workspace_high"):
            box = getattr(self, name)
            if box is not None and (len(box) != 3 or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                              and math.isfinite(x) for x in box)):
                raise ValueError(f"safety.{name}={box!r} must be 3 finite numbers (m)")
        if self.workspace_low is not None and any(lo >= hi for lo, hi in zip(self.workspace_low, self.workspace_high,
                                                                             strict=True)):
            raise ValueError(f"safety.workspace_low {self.workspace_low} must be below workspace_high {self.workspace_high}")
        if not self.watchdog_s <= self.disable_after_s:
            raise ValueError(f"need safety.watchdog_s ({self.watchdog_s}) <= safety.disable_after_s "
                             f"({self.disable_after_s})")


class SafetySupervisor:
    def __init__(self, cfg: SafetyConfig, joint_low: np.ndarray, joint_high: np.ndarray, dt: float,
                 forward_kinematics: Callable[[np.ndarray], np.ndarray] | None = None):
        if cfg.workspace_low is not None and forward_kinematics is None:
            raise ValueError("a workspace box needs forward kinematics (the task's model)")
        if not (math.isfinite(dt) and dt > 0):
            raise ValueError(f"control period dt={dt!r} must be a finite number > 0")
        self.cfg, self.dt = cfg, dt
        self.joint_low, self.joint_high = np.asarray(joint_low, np.float64), np.asarray(joint_high, np.float64)
        self.fk = forward_kinematics
        self.max_step = cfg.max_joint_velocity * dt
        self.max_change = cfg.max_joint_acceleration * dt**2
        self.interventions: Counter[str] = Counter()
        self.estopped = False
        """the latch: set by an e-stop, a watchdog disable or a control-loop fault"""
        self.estop_reason = ""
        self._last: np.ndarray | None = None
        self._prev: np.ndarray | None = None

    @property
    def latched(self) -> bool:
        return self.estopped

    def reset(self, qpos: np.ndarray) -> None:
        """Start from the measured position, at rest (a new episode). The latch stays: see ``clear_estop``."""
        qpos = np.asarray(qpos, np.float64)
        if qpos.shape != self.joint_low.shape or not np.isfinite(qpos).all():
            raise ValueError(f"the measured joint positions {qpos} are not {self.joint_low.shape[0]} finite numbers")
        self._last = qpos.copy()
        self._prev = self._last.copy()

    def clear_estop(self) -> None:
        """Only an operator's deliberate act re-arms the supervisor after an e-stop, a watchdog disable or a fault
        (and the robot must be re-enabled by its own procedure)."""
        if self.estopped:
            log.warning("latch cleared by the operator (was: %s)", self.estop_reason)
        self.estopped, self.estop_reason = False, ""

    def latch(self, reason: str, kind: str = "latch") -> None:
        if not self.estopped:
            self.estopped, self.estop_reason = True, reason
            self._count(kind, reason)

    def _count(self, kind: str, detail: str) -> None:
        """Count an intervention; per-step ones are logged at debug level (``rlrobot deploy --verbose`` shows them;
        deploy's table counts them per episode), the latching ones as warnings."""
        self.interventions[kind] += 1
        log.log(logging.WARNING if kind in LATCH_KINDS else logging.DEBUG, "safety intervention %s: %s", kind, detail)

    def _check(self) -> None:
        if self.estopped:
            raise SafetyLatched(f"the safety supervisor is latched ({self.estop_reason}); no command is allowed")
        if self._last is None:
            raise RuntimeError("call reset(qpos) with the measured position before filtering commands")

    def _window(self) -> tuple[np.ndarray, np.ndarray]:
        return step_window(self._last, self._prev, self.max_step, self.max_change, self.joint_low, self.joint_high)

    def _brake(self) -> np.ndarray:
        lo, hi = self._window()
        return self._emit(self._last + np.clip(0.0, lo, hi))

    def filter(self, targets: np.ndarray) -> np.ndarray:
        """The command that may reach the robot for the policy's ``targets`` (rad). Refuses when latched."""
        self._check()
        targets = np.asarray(targets, np.float64)
        if targets.shape != self._last.shape or not np.isfinite(targets).all():
            self._count("nonfinite", f"rejected {targets}")
            return self._brake()
        clamped = targets.clip(self.joint_low, self.joint_high)
        if np.abs(clamped - targets).max() > ENCODER_STEP:  # every clamp is applied; counted when the servo can see it
            self._count("joint_limit", f"{targets} -> {clamped}")
        wanted = clamped - self._last
        lo, hi = self._window()
        step = wanted.clip(lo, hi)
        if np.abs(wanted).max() > self.max_step + ENCODER_STEP:
            self._count("velocity", f"step {np.abs(wanted).max():.3f} rad > {self.max_step:.3f}")
        if np.abs(step - wanted.clip(-self.max_step, self.max_step)).max() > ENCODER_STEP:
            self._count("acceleration", f"step {np.round(wanted, 4)} -> {np.round(step, 4)}")
        command = self._last + step
        if self.cfg.workspace_low is not None:
            tcp = self.fk(command)
            if np.any(tcp < self.cfg.workspace_low) or np.any(tcp > self.cfg.workspace_high):
                self._count("workspace", f"TCP {np.round(tcp, 3)} outside the box")
                return self._brake()
        return self._emit(command)

    def stop(self) -> np.ndarray:
        """The command of a hold tick: brake towards rest at the acceleration limit (at rest: stay). Refuses when
        latched."""
        self._check()
        return self._brake()

    def _emit(self, command: np.ndarray) -> np.ndarray:
        self._prev, self._last = self._last, command
        return command.copy()

    @property
    def last_command(self) -> np.ndarray | None:
        return None if self._last is None else self._last.copy()

    def watchdog(self, seconds_since_fresh_action: float) -> str:
        if seconds_since_fresh_action >= self.cfg.disable_after_s:
            return "disable"
        if seconds_since_fresh_action >= self.cfg.watchdog_s:
            return "hold"
        return "ok"

    # ------------------------------------------------------------------ e-stop
    def estop(self, reason: str = "e-stop") -> None:
        self.latch(reason, kind="estop")

    def install_signal_estop(self, signum: int = signal.SIGUSR1) -> None:
        """``kill -USR1 <pid>`` triggers the e-stop (main thread only, as Python requires)."""
        signal.signal(signum, lambda *_: self.estop(f"signal {signal.Signals(signum).name}"))

    def start_key_estop(self, key: str = "e", stream=None) -> threading.Thread:
        """A daemon thread that triggers the e-stop when a line starting with ``key`` (or an empty line) is read."""
        import sys

        stream = stream or sys.stdin

        def watch():
            for line in stream:
                if not line.strip() or line.strip().lower().startswith(key):
                    self.estop(f"key {line.strip()!r}")
                    return

        thread = threading.Thread(target=watch, daemon=True, name="estop-keys")
        thread.start()
        return thread

    def summary(self) -> dict[str, int]:
        return dict(self.interventions)

