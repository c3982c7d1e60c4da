"""Safety supervisor: sits between any policy and any robot; nothing reaches the motors without passing it.

Per command, in this order: NaN/Inf rejection (hold the last safe target), joint-limit clamp, per-step velocity clamp,
per-step acceleration clamp, optional end-effector workspace box (forward kinematics of the *target*, from the
task's MJCF; a target outside is refused and the last safe target kept). A watchdog turns "no fresh action" into
hold, then disable; an e-stop (from code, a signal or a key) latches until ``reset``. Every intervention is counted
and logged.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

log = logging.getLogger("rlrobot.safety")

WATCHDOG_STATES = ("ok", "hold", "disable")


@dataclass
class SafetyConfig:
    max_joint_velocity: float = 6.0
    """rad/s per joint; a command further than velocity x dt from the previous one is clamped"""
    max_joint_acceleration: float = 150.0
    """rad/s^2 per joint (a change of per-step velocity above acceleration x dt^2 is clamped)"""
    workspace_low: tuple[float, float, float] | None = None
    """TCP box corner (m, robot base frame); targets whose TCP leaves the box are refused"""
    workspace_high: tuple[float, float, float] | None = None
    watchdog_s: float = 0.25
    """no fresh action for this long -> hold position"""
    disable_after_s: float = 1.0
    """no fresh action for this long -> disable (torque off) and abort the episode"""

    def __post_init__(self):
        if self.max_joint_velocity <= 0 or self.max_joint_acceleration <= 0:
            raise ValueError("safety.max_joint_velocity and safety.max_joint_acceleration must be > 0")
        if (self.workspace_low is None) != (self.workspace_high is None):
            raise ValueError("safety.workspace_low and safety.workspace_high must be given together")
        if self.workspace_low is not None and any(lo >= hi for lo, hi in zip(self.workspace_low, self.workspace_high,
                                                                             strict=True)):
            raise ValueError(f"safety.workspace_low {self.workspace_low} must be below workspace_high {self.workspace_high}")
        if not 0 < self.watchdog_s <= self.disable_after_s:
            raise ValueError(f"need 0 < safety.watchdog_s ({self.watchdog_s}) <= safety.disable_after_s "
                             f"({self.disable_after_s})")


class SafetySupervisor:
    def __init__(self, cfg: SafetyConfig, joint_low: np.ndarray, joint_high: np.ndarray, dt: float,
                 forward_kinematics: Callable[[np.ndarray], np.ndarray] | None = None):
        if cfg.workspace_low is not None and forward_kinematics is None:
            raise ValueError("a workspace box needs forward kinematics (the task's model)")
        self.cfg, self.dt = cfg, dt
        self.joint_low, self.joint_high = np.asarray(joint_low, np.float64), np.asarray(joint_high, np.float64)
        self.fk = forward_kinematics
        self.interventions: Counter[str] = Counter()
        self.estopped = False
        self.estop_reason = ""
        self._last: np.ndarray | None = None
        self._prev: np.ndarray | None = None

    def reset(self, qpos: np.ndarray) -> None:
        """Start from the measured position (a new episode). An e-stop stays latched: see ``clear_estop``."""
        self._last = np.asarray(qpos, np.float64).copy()
        self._prev = self._last.copy()

    def clear_estop(self) -> None:
        """Only an operator's deliberate act re-arms the robot after an e-stop."""
        self.estopped, self.estop_reason = False, ""

    def _count(self, kind: str, detail: str) -> None:
        self.interventions[kind] += 1
        log.warning("safety intervention %s: %s", kind, detail)

    def filter(self, targets: np.ndarray) -> np.ndarray:
        """The command that may reach the robot for the policy's ``targets`` (rad)."""
        if self._last is None:
            raise RuntimeError("call reset(qpos) with the measured position before filtering commands")
        targets = np.asarray(targets, np.float64)
        if targets.shape != self._last.shape or not np.isfinite(targets).all():
            self._count("nonfinite", f"rejected {targets}")
            return self._accept(self._last.copy(), moved=False)
        clamped = targets.clip(self.joint_low, self.joint_high)
        if not np.array_equal(clamped, targets):
            self._count("joint_limit", f"{targets} -> {clamped}")
        step = clamped - self._last
        max_step = self.cfg.max_joint_velocity * self.dt
        if np.abs(step).max() > max_step:
            self._count("velocity", f"step {np.abs(step).max():.3f} rad > {max_step:.3f}")
            step = step.clip(-max_step, max_step)
        prev_step = self._last - self._prev
        max_change = self.cfg.max_joint_acceleration * self.dt**2
        if np.abs(step - prev_step).max() > max_change:
            self._count("acceleration", f"step change {np.abs(step - prev_step).max():.4f} rad > {max_change:.4f}")
            step = prev_step + (step - prev_step).clip(-max_change, max_change)
        command = (self._last + step).clip(self.joint_low, self.joint_high)
        if self.cfg.workspace_low is not None:
            tcp = self.fk(command)
            if np.any(tcp < self.cfg.workspace_low) or np.any(tcp > self.cfg.workspace_high):
                self._count("workspace", f"TCP {np.round(tcp, 3)} outside the box")
                return self._accept(self._last.copy(), moved=False)
        return self._accept(command, moved=True)

    def _accept(self, command: np.ndarray, moved: bool) -> np.ndarray:
        self._prev = self._last if moved else self._last.copy()
        self._last = command
        return command.copy()

    def hold_at(self, qpos: np.ndarray) -> None:
        """The robot holds at ``qpos``: the next command starts from rest there."""
        self._last = np.asarray(qpos, np.float64).copy()
        self._prev = self._last.copy()

    def watchdog(self, seconds_since_fresh_action: float) -> str:
        if seconds_since_fresh_action >= self.cfg.disable_after_s:
            return "disable"
        if seconds_since_fresh_action >= self.cfg.watchdog_s:
            return "hold"
        return "ok"

    # ------------------------------------------------------------------ e-stop
    def estop(self, reason: str = "e-stop") -> None:
        if not self.estopped:
            self.estopped, self.estop_reason = True, reason
            self._count("estop", reason)

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

