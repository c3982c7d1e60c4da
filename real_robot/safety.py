"""Safety supervisor: sits between any policy and any robot; nothing reaches the motors without passing it.

Per command: NaN/Inf or wrong-shape targets are refused; the target is clamped to the joint limits; then the step
from the last command is clamped to a window that keeps *every* emitted step within the velocity limit (|step| <=
v dt) and the acceleration limit (|step - previous step| <= a dt^2), and that leaves room to brake to rest before a
joint limit. Refusals (non-finite targets, a TCP outside the workspace box) and holds brake at the acceleration
limit instead of stopping dead, so they never violate it either. The first command of an episode starts from the
*measured* position at rest, even when a reading lies outside the joint limits (readings are not clipped): the
arm then moves back inside at the same rates, never jumps to the limit.

Every reading of the arm is checked before anything uses it (``check_reading``): finite, inside the joint limits
plus a margin, newer than the last one, and consistent with the last good reading and the last command within
what the servo can move in the elapsed time; a frozen reading while the commands move is a fault too. A failed
check latches the supervisor. Every command, emergency holds included, comes from the supervisor
(``emergency_command`` when latched), and ``checked_command`` is the last gate before a driver: finite, the right
shape, inside the joint limits plus the reading margin.

The workspace box gets braking room like the joint limits: a command is accepted only if the TCP, braking to rest
from it at the acceleration limit, stays inside the box; outside the box (a start outside, or an overshoot) a
command that reduces the violation is always allowed, so the arm is never frozen outside.

A watchdog turns "no fresh action" into hold, then disable. The supervisor has one latch: an e-stop (from code, a
signal or a key), a watchdog disable or a control-loop fault sets it, ``filter``/``stop`` refuse while it is set,
and only ``clear_estop`` (an operator's deliberate act) clears it. Every intervention is counted and logged.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlrobot.tasks.servo_limits import STS3215_MAX_ACCELERATION, STS3215_MAX_VELOCITY, step_window

log = logging.getLogger("rlrobot.safety")


class SafetyLatched(RuntimeError):
    """A command was asked for while the supervisor is latched (e-stop, watchdog disable or fault)."""


class UnsafeCommand(RuntimeError):
    """A command failed the last check before a driver (non-finite, wrong shape, outside the limits): never sent."""


def _positive_finite(name: str, value, upper: float | None = None, why: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"safety.{name}={value!r} must be a finite number > 0" + (f" and <= {upper:g}{why}" if upper else ""))
    if upper is not None and value > upper:
        raise ValueError(f"safety.{name}={value!r} must be a finite number > 0 and <= {upper:g}{why}")


ENCODER_STEP = 2 * math.pi / 4096
"""one count of the STS3215's 12-bit encoder (rad): a clamp smaller than this is applied but not counted as an
intervention (the servo cannot resolve it; e.g. the braking window shaves ~1e-5 rad off a step that ends at a joint
limit)"""
MAX_WATCHDOG_S = 5.0
MAX_DISABLE_AFTER_S = 10.0
MAX_WORKSPACE_M = 2.0
"""an SO-101 reaches ~0.5 m: a box corner further than this is a typo, not a workspace"""
LATCH_KINDS = ("estop", "watchdog_disable", "fault", "reading_fault", "latch")
"""interventions that latch the supervisor: logged as warnings (the others, per-step clamps, at debug level)"""



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

    reading_margin: float = 0.2
    """rad beyond the joint limits that a reading may lie (calibration slack); further out it is a fault"""
    reading_tolerance: float = 0.1
    """rad of sensor noise, backlash and servo overshoot allowed around what the arm can physically have done since
    the last reading (move towards its command, at most at the servo's speed)"""
    frozen_reading_s: float = 0.3
    """bit-identical readings for this long while the commands moved more than reading_tolerance, or while two or
    more joints are commanded further than that from them: a fault (a stale bus, a stuck driver, a blocked arm)"""

    def __post_init__(self):
        # bounded by the hardware: a limit above the servo's own only lets the target run away from the arm, and a
        # watchdog of minutes is no watchdog
        bounds = {"max_joint_velocity": (STS3215_MAX_VELOCITY, " rad/s (the STS3215 servo's top speed)"),
                  "max_joint_acceleration": (STS3215_MAX_ACCELERATION, " rad/s^2 (the servo's ramp)"),
                  "watchdog_s": (MAX_WATCHDOG_S, " s"), "disable_after_s": (MAX_DISABLE_AFTER_S, " s"),
                  "reading_margin": (0.5, " rad"), "reading_tolerance": (0.5, " rad"), "frozen_reading_s": (5.0, " s")}
        for name, (upper, why) in bounds.items():
            _positive_finite(name, getattr(self, name), upper, why)
        if (self.workspace_low is None) != (self.workspace_high is None):
            raise ValueError("safety.workspace_low and safety.workspace_high must be given together")
        for name in ("workspace_low", "workspace_high"):
            box = getattr(self, name)
            if box is not None and (len(box) != 3 or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                              and math.isfinite(x) for x in box)):
                raise ValueError(f"safety.{name}={box!r} must be 3 finite numbers (m)")
            if box is not None and any(abs(x) > MAX_WORKSPACE_M for x in box):
                raise ValueError(f"safety.{name}={box!r} must lie within +-{MAX_WORKSPACE_M:g} m of the robot base")
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
        self.changed = {"steps": 0, "sum_rad": 0.0, "max_rad": 0.0}
        """acting commands the supervisor moved away from the policy's target, and by how much (largest joint, rad)"""
        self.estopped = False
        """the latch: set by an e-stop, a watchdog disable or a control-loop fault"""
        self.estop_reason = ""
        self.latch_kind = ""
        self.latched_event = threading.Event()
        """set with the latch: lets a watcher thread act on wall time instead of waiting for the next control tick"""
        self._last: np.ndarray | None = None
        self._prev: np.ndarray | None = None
        self._good_reading: np.ndarray | None = None
        self._good_time: float | None = None
        self._frozen_since: tuple[float, np.ndarray, int] | None = None  # (time, command, ticks) since it last changed

    @property
    def latched(self) -> bool:
        return self.estopped

    # ------------------------------------------------------------------ readings
    def _reading_fault(self, reason: str) -> str:
        self.latch(f"reading fault: {reason}", kind="reading_fault")
        return self.estop_reason

    def _plausible(self, qpos: Any) -> tuple[np.ndarray | None, str]:
        """(qpos as float64, "") when it is the right number of finite values inside the limits plus the margin."""
        try:
            q = np.asarray(qpos, np.float64)
        except (TypeError, ValueError) as e:
            return None, f"not numeric ({type(e).__name__})"
        if q.shape != self.joint_low.shape:
            return None, f"shape {q.shape}, expected {self.joint_low.shape}"
        if not np.isfinite(q).all():
            return None, f"non-finite joint positions {q}"
        margin = self.cfg.reading_margin
        outside = (q < self.joint_low - margin) | (q > self.joint_high + margin)
        if outside.any():
            return None, (f"joint {int(np.argmax(outside))} reads {q[outside][0]:.4g} rad, beyond its limits "
                          f"[{self.joint_low[outside][0]:.3f}, {self.joint_high[outside][0]:.3f}] + {margin:g} rad")
        return q, ""

    def check_reading(self, qpos: Any, timestamp: float | None = None) -> str | None:
        """None for a reading that may be used; else the reason, and the supervisor is latched (a reading fault).

        A good reading is finite, inside the limits plus ``reading_margin``, newer than the last one, and where the
        arm can be: between the last good reading and the last command (the servo moves towards its target), at most
        1.5 x the servo's speed times the elapsed time away, each with ``reading_tolerance`` of slack. Bit-identical
        readings for ``frozen_reading_s`` while the commands moved are a fault too."""
        if self.estopped:
            return self.estop_reason
        now = time.monotonic() if timestamp is None else float(timestamp)
        q, why = self._plausible(qpos)
        if q is None:
            return self._reading_fault(why)
        if self._good_reading is None or self._last is None:
            return self._reading_fault("no reading was checked at the start of the episode (call reset)")
        if timestamp is not None and not math.isfinite(now):
            return self._reading_fault(f"timestamp {timestamp!r} is not finite")
        if now <= self._good_time:
            return self._reading_fault(f"stale reading: its timestamp {now:.6f} is not newer than the last {self._good_time:.6f}")
        elapsed = max(now - self._good_time, self.dt)  # one reading a tick; a twin stepped faster than real time moves dt
        tol = self.cfg.reading_tolerance
        lo = np.minimum(self._good_reading, self._last) - tol
        hi = np.maximum(self._good_reading, self._last) + tol
        reach = 1.5 * self.cfg.max_joint_velocity * elapsed + tol
        bad = (q < lo) | (q > hi) | (np.abs(q - self._good_reading) > reach)
        if bad.any():
            j = int(np.argmax(bad))
            return self._reading_fault(f"joint {j} jumped from {self._good_reading[j]:.4f} to {q[j]:.4f} rad in {elapsed:.3f} s "
                                       f"while commanded to {self._last[j]:.4f}: more than the servo can move")
        if np.array_equal(q, self._good_reading):
            since, command_then, ticks = self._frozen_since or (self._good_time, self._last.copy(), 0)
            self._frozen_since = (since, command_then, ticks + 1)
            frozen_for = max(now - since, (ticks + 1) * self.dt)
            moved = np.abs(self._last - command_then).max()
            # a servo commanded away moves; one joint held off its target is a grasp (the gripper on an object)
            pulled = int((np.abs(self._last - q) > tol).sum())
            if frozen_for >= self.cfg.frozen_reading_s and (moved > tol or pulled >= 2):
                return self._reading_fault(f"frozen reading: identical for {frozen_for:.2f} s while the commands moved "
                                           f"{moved:.3f} rad and {pulled} joints were commanded elsewhere")
        else:
            self._frozen_since = None
        self._good_reading, self._good_time = q, now
        return None

    def reset(self, qpos: np.ndarray, timestamp: float | None = None) -> None:
        """Start from the measured position, at rest (a new episode). The latch stays: see ``clear_estop``. A reading
        that is not plausible raises ValueError and leaves no position to hold at (an emergency stop then disables)."""
        self._last = self._prev = self._good_reading = None
        self._frozen_since = None
        q, why = self._plausible(qpos)
        if q is None:
            raise ValueError(f"the measured joint positions are not usable: {why}")
        self._last = q.copy()
        self._prev = self._last.copy()
        self._good_reading = q.copy()
        self._good_time = time.monotonic() if timestamp is None else float(timestamp)

    def clear_estop(self) -> None:
        """Only an operator's deliberate act re-arms the supervisor after an e-stop, a watchdog disable or a fault
        (and the robot must be re-enabled by its own procedure)."""
        if self.estopped:
            log.warning("latch cleared by the operator (was: %s)", self.estop_reason)
        self.estopped, self.estop_reason, self.latch_kind = False, "", ""
        self.latched_event.clear()

    def latch(self, reason: str, kind: str = "latch") -> None:
        if not self.estopped:
            self.estopped, self.estop_reason, self.latch_kind = True, reason, kind
            self._count(kind, reason)
            self.latched_event.set()

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

    def _brake_step(self) -> np.ndarray:
        lo, hi = self._window()
        return np.clip(0.0, lo, hi)

    def _brake(self) -> np.ndarray:
        return self._emit(self._last + self._brake_step())

    # ------------------------------------------------------------------ workspace box
    def _box_violation(self, q: np.ndarray) -> float:
        """How far (m) the TCP of joint positions ``q`` lies outside the box (0 inside)."""
        tcp = np.asarray(self.fk(q), np.float64)
        low, high = np.asarray(self.cfg.workspace_low), np.asarray(self.cfg.workspace_high)
        outside = np.maximum(low - tcp, 0.0) + np.maximum(tcp - high, 0.0)
        return float(np.linalg.norm(outside)) if np.isfinite(tcp).all() else math.inf

    def _rest_point(self, step: np.ndarray) -> np.ndarray:
        """Where the arm comes to rest if it takes ``step`` and then brakes at the acceleration limit (per joint
        |s| - c, |s| - 2c, ...: at most s^2 / (2c) + |s| / 2 further along)."""
        return self._last + step + np.sign(step) * (step**2 / (2 * self.max_change) + np.abs(step) / 2)

    def _box_ok(self, step: np.ndarray, now: float) -> bool:
        """The step keeps the TCP (and its rest point after braking) in the box, or outside reduces the violation."""
        if now == 0.0:
            return self._box_violation(self._last + step) == 0.0 and self._box_violation(self._rest_point(step)) == 0.0
        return self._box_violation(self._last + step) < now  # outside: anything that brings the TCP back is allowed

    def _box_step(self, step: np.ndarray) -> np.ndarray | None:
        """The largest fraction of ``step`` (from the braking step towards it) that the box allows; None if none."""
        now = self._box_violation(self._last)
        if self._box_ok(step, now):
            return step
        brake = self._brake_step()
        lo, hi = 0.0, 1.0
        for _ in range(12):  # bisection: 1/4096 of the step
            mid = 0.5 * (lo + hi)
            if self._box_ok(brake + mid * (step - brake), now):
                lo = mid
            else:
                hi = mid
        return brake + lo * (step - brake) if lo > 0 else None

    # ------------------------------------------------------------------ commands
    def filter(self, targets: Any) -> np.ndarray:
        """The command that may reach the robot for the policy's ``targets`` (rad). Refuses when latched; anything
        that is not a finite target of the right shape is refused (counted) and the arm brakes."""
        self._check()
        try:
            targets = np.asarray(targets, np.float64)
        except (TypeError, ValueError):
            targets = None
        if targets is None or targets.shape != self._last.shape or not np.isfinite(targets).all():
            self._count("nonfinite", f"rejected {str(targets)[:200]}")
            return self._brake()
        return self._note_change(targets, self._limit(targets))

    def _limit(self, targets: np.ndarray) -> np.ndarray:
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
        if self.cfg.workspace_low is not None:
            allowed = self._box_step(step)
            if allowed is None:
                self._count("workspace", f"TCP of {np.round(self._last + step, 3)} leaves the box or cannot brake before it")
                return self._brake()
            if np.abs(allowed - step).max() > ENCODER_STEP:
                self._count("workspace", "step shortened to brake before the box")
            step = allowed
        return self._emit(self._last + step)

    def _note_change(self, targets: np.ndarray, command: np.ndarray) -> np.ndarray:
        gap = float(np.abs(command - targets).max())
        if gap > ENCODER_STEP:
            self.changed["steps"] += 1
            self.changed["sum_rad"] += gap
            self.changed["max_rad"] = max(self.changed["max_rad"], gap)
        return command

    def stop(self) -> np.ndarray:
        """The command of a hold tick: brake towards rest at the acceleration limit (at rest: stay). Refuses when
        latched."""
        self._check()
        return self._brake()

    def emergency_command(self) -> np.ndarray | None:
        """The hold command of an emergency stop, allowed while latched: the braking step from the last command (a
        position that passed every check), or None when there is none (nothing checked yet: disable instead)."""
        if self._last is None or self._prev is None:
            return None
        command = self._last + self._brake_step()
        return self._emit(command) if np.isfinite(command).all() else None

    def checked_command(self, command: Any) -> np.ndarray:
        """The last gate before a driver: a finite command of the right shape, inside the joint limits plus the
        reading margin (a start outside the limits moves back in from within that margin). Raises UnsafeCommand."""
        try:
            q = np.asarray(command, np.float64)
        except (TypeError, ValueError) as e:
            raise UnsafeCommand(f"command {str(command)[:80]} is not numeric") from e
        margin = self.cfg.reading_margin + 1e-9
        if q.shape != self.joint_low.shape or not np.isfinite(q).all() \
                or (q < self.joint_low - margin).any() or (q > self.joint_high + margin).any():
            raise UnsafeCommand(f"command {q} is not {self.joint_low.shape[0]} finite positions inside the joint limits")
        return q

    def _emit(self, command: np.ndarray) -> np.ndarray:
        self._prev, self._last = self._last, command
        return command.copy()

    @property
    def last_command(self) -> np.ndarray | None:
        return None if self._last is None else self._last.copy()

    @property
    def last_good_reading(self) -> np.ndarray | None:
        return None if self._good_reading is None else self._good_reading.copy()

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

