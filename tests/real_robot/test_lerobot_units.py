"""The LeRobot driver's unit mapping: LeRobot's normalised motor units <-> our joint radians."""

import math

import numpy as np
import pytest

from rlrobot.real_robot.drivers.lerobot import TICKS_PER_TURN, from_radians, to_radians
from rlrobot.tasks.so101 import JOINT_HIGH, JOINT_LOW

CAL = {"range_min": 1000, "range_max": 3000}  # raw encoder ticks of a calibrated joint


def lerobot_normalize(ticks, mode, cal):
    """LeRobot 0.4.4 MotorsBus._normalize for one motor (drive_mode 0), written out from its source."""
    lo, hi = cal["range_min"], cal["range_max"]
    bounded = min(hi, max(lo, ticks))
    if mode == "range_m100_100":
        return (bounded - lo) / (hi - lo) * 200 - 100
    if mode == "range_0_100":
        return (bounded - lo) / (hi - lo) * 100
    return (ticks - (lo + hi) / 2) * 360 / (TICKS_PER_TURN - 1)


# a real SO-101 follower's calibration (LeRobot's calibrate(): ranges of motion in raw ticks)
SO101_CALIBRATION = {"shoulder_pan": (746, 3477), "shoulder_lift": (822, 3211), "elbow_flex": (901, 3110),
                     "wrist_flex": (849, 3216), "wrist_roll": (135, 3984), "gripper": (1975, 3565)}


@pytest.mark.parametrize("mode", ["degrees", "range_m100_100"])
def test_radians_are_physical_encoder_angles(mode):
    mid = (CAL["range_min"] + CAL["range_max"]) / 2
    for ticks in (1000, 1500, 2000, 2600, 3000):
        rad = to_radians(lerobot_normalize(ticks, mode, CAL), mode, 0, CAL)
        # 0 rad at mid-range (LeRobot's calibration convention), 2 pi per 4096 ticks
        assert rad == pytest.approx((ticks - mid) * 2 * math.pi / TICKS_PER_TURN, abs=1e-9)
        assert from_radians(rad, mode, 0, CAL) == pytest.approx(lerobot_normalize(ticks, mode, CAL), abs=1e-9)


def test_the_grippers_0_to_100_spans_the_model_grippers_range_with_a_real_calibration():
    """The arm's calibrated closed..open (0..100) is the model's closed..open, not a range centred on 0 rad: the model's
    closed target is sent as 0 and a closed reading comes back as the model's closed angle."""
    lo, hi = SO101_CALIBRATION["gripper"]
    cal = {"range_min": lo, "range_max": hi}
    assert from_radians(JOINT_LOW[5], "range_0_100", 5, cal) == pytest.approx(0.0)
    assert from_radians(JOINT_HIGH[5], "range_0_100", 5, cal) == pytest.approx(100.0)
    assert to_radians(0.0, "range_0_100", 5, cal) == pytest.approx(JOINT_LOW[5])
    assert to_radians(100.0, "range_0_100", 5, cal) == pytest.approx(JOINT_HIGH[5])
    half_open = 0.5 * (JOINT_LOW[5] + JOINT_HIGH[5])
    assert to_radians(lerobot_normalize((lo + hi) / 2, "range_0_100", cal), "range_0_100", 5, cal) == pytest.approx(half_open)
    for value in (0.0, 17.5, 41.0, 88.0, 100.0):  # and back
        assert from_radians(to_radians(value, "range_0_100", 5, cal), "range_0_100", 5, cal) == pytest.approx(value)


def test_the_gripper_maps_like_the_lerobot_profile():
    from rlrobot.tasks.so101 import profile_units

    units = profile_units()
    for value in (0.0, 33.0, 100.0):
        q = to_radians(value, "range_0_100", 5, {"range_min": 1975, "range_max": 3565})
        assert units.to_profile(np.r_[np.zeros(5), q])[5] == pytest.approx(value)


def test_without_calibration_the_model_limits_are_the_range():
    for j in range(6):
        assert to_radians(-100, "range_m100_100", j) == pytest.approx(JOINT_LOW[j])
        assert to_radians(100, "range_m100_100", j) == pytest.approx(JOINT_HIGH[j])
        assert to_radians(0, "range_0_100", j) == pytest.approx(JOINT_LOW[j])
    assert from_radians(10.0, "range_m100_100", 0) == 100.0  # out of range clips like LeRobot's unnormalise


def test_against_lerobot_so101_motor_definitions():
    pytest.importorskip("lerobot", reason="lerobot is not installed (optional extra: pip install 'rlrobot[lerobot]')")
    pytest.importorskip("scservo_sdk", reason="LeRobot's Feetech bus needs the feetech-servo-sdk package")
    from lerobot.motors import MotorCalibration
    from lerobot.robots.so_follower import SO101Follower, SO101FollowerConfig

    from rlrobot.real_robot.drivers.lerobot import LeRobotArm

    robot = SO101Follower(SO101FollowerConfig(port="/dev/null", id="rlrobot_test", use_degrees=True))
    cal = {name: MotorCalibration(id=m.id, drive_mode=0, homing_offset=0, range_min=1000, range_max=3000)
           for name, m in robot.bus.motors.items()}
    robot.bus.calibration = cal
    robot.calibration = cal
    arm = LeRobotArm(robot=robot)
    arm._modes = arm._norm_modes()
    assert arm._modes[:5] == ["degrees"] * 5 and arm._modes[5] == "range_0_100"
    ticks = {name: 1700 + 100 * m.id for name, m in robot.bus.motors.items()}
    normalized = robot.bus._normalize({robot.bus.motors[n].id: t for n, t in ticks.items()})
    for j, name in enumerate(robot.bus.motors):
        rad = to_radians(normalized[robot.bus.motors[name].id], arm._modes[j], j, arm._calibration(name))
        assert rad == pytest.approx((ticks[name] - 2000) * 2 * np.pi / TICKS_PER_TURN, abs=1e-9)
