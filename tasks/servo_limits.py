"""The SO-101's servos, the Feetech STS3215, as both sides model them: their speed and acceleration limits, and the
window those limits leave for the next joint command. The deploy supervisor (``rlrobot.real_robot.safety``) clamps a
real arm's commands to this window; the simulated tasks' ``servo_limits`` hold their joint targets to the same one, so
a trained policy is not clamped on the arm."""

from __future__ import annotations

import numpy as np

# Defaults from the SO-101's servos, the Feetech STS3215 (all six joints of the LeRobot follower, gear 1/345):
# - speed: no-load 0.222 s / 60 deg at 7.4 V (the 12 V C018 measures the same 45-46 rpm) = 4.7 rad/s. The arm cannot
#   turn faster, so a faster command only lets the target run ahead of the arm;
# - acceleration: LeRobot's SO-101 follower writes Acceleration = 254 to every servo at connect
#   (FeetechMotorsBus.configure_motors), in units of 100 steps/s^2 of a 4096-step turn: 25400 steps/s^2 = 39 rad/s^2,
#   the ramp the servo itself follows (the register's largest value short of 0 = no ramp).
STS3215_MAX_VELOCITY = 4.7
STS3215_MAX_ACCELERATION = 39.0


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
