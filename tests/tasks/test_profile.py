"""The LeRobot SO-101 profile (--obs-mode lerobot): LeRobot's names, order and units, the camera frames through the
one preprocessing, the privileged state beside them, the 30 Hz rate, delays and latency."""

import json
import math

import numpy as np
import pytest
import torch

import rlrobot
from rlrobot.tasks.profile import (
    MOTOR_NAMES,
    PRIVILEGED_KEY,
    STATE_NAMES,
    centred_square,
    crop_box,
    prepare_frames,
    render_shape,
)
from rlrobot.tasks.setup import load_setup
from rlrobot.tasks.so101 import HOME_QPOS, JOINT_HIGH, JOINT_LOW, JOINT_NAMES, profile_units


def quiet_setup(**randomization) -> str:
    """The default setup without randomisation (or with the given sections), as inline JSON."""
    setup = load_setup(None).to_dict()
    setup["randomization"] = {"physics": {"friction": [1, 1], "object_mass": [1, 1]}, "greenscreen": False,
                              **randomization}
    return json.dumps(setup)


def lerobot_degrees(ticks: float, range_min: int, range_max: int) -> float:
    """LeRobot's MotorsBus._normalize in DEGREES mode (0.4.4 / 0.6.1), written out from its source."""
    return (ticks - (range_min + range_max) / 2) * 360 / 4095


def test_the_motors_are_lerobots_so101_follower_motors_in_its_bus_order():
    assert MOTOR_NAMES == JOINT_NAMES
    assert STATE_NAMES == ("shoulder_pan.pos", "shoulder_lift.pos", "elbow_flex.pos", "wrist_flex.pos", "wrist_roll.pos",
                           "gripper.pos")


def test_degrees_are_lerobots_degrees_of_the_joint_angle():
    """A joint at angle q from the middle of its calibrated range reads (ticks - mid) * 360 / 4095 in LeRobot."""
    units = profile_units(use_degrees=True)
    lo, hi = 1000, 3000
    for ticks in (1000, 1733, 2000, 2871, 3000):
        q = (ticks - 2000) * 2 * math.pi / 4096
        assert units.to_profile(np.r_[[q] * 5, 0.5])[:5] == pytest.approx([lerobot_degrees(ticks, lo, hi)] * 5, abs=1e-9)


def test_minus_100_to_100_spans_each_joints_range_and_the_gripper_0_to_100():
    units = profile_units(use_degrees=False)
    assert units.to_profile(JOINT_LOW) == pytest.approx([-100, -100, -100, -100, -100, 0])
    assert units.to_profile(JOINT_HIGH) == pytest.approx([100, 100, 100, 100, 100, 100])
    assert profile_units().to_profile(JOINT_LOW)[5] == pytest.approx(0.0)
    assert profile_units().to_profile(JOINT_HIGH)[5] == pytest.approx(100.0)


@pytest.mark.parametrize("use_degrees", [True, False])
def test_units_and_actions_go_back_and_forth(use_degrees):
    units = profile_units(use_degrees)
    rng = np.random.default_rng(0)
    q = rng.uniform(JOINT_LOW, JOINT_HIGH, (50, 6))
    assert units.to_radians(units.to_profile(q)) == pytest.approx(q, abs=1e-12)
    a = rng.uniform(-1, 1, (50, 6))
    assert units.profile_to_normalized(units.normalized_to_profile(a)) == pytest.approx(a, abs=1e-9)


@pytest.mark.parametrize("task", ["so101-reach", "so101-push", "so101-lift", "so101-pick-place"])
def test_a_profile_env_observes_the_six_readings_the_cameras_and_the_privileged_state(task):
    env = rlrobot.make(task, 2, seed=0, obs_mode="lerobot", control_mode="joint_pos", setup=quiet_setup())
    obs, _ = env.reset(seed=0)
    language = {"instruction_tokens", "instruction_embedding"} if task == "so101-pick-place" else set()
    assert set(obs) == {"state", "image_front", "image_wrist", PRIVILEGED_KEY} | language
    assert obs["state"].shape == (2, 6) and obs["state"].dtype == torch.float32
    assert obs["image_front"].shape == (2, 3, 64, 64) and obs["image_front"].dtype == torch.uint8
    # no noise in this setup: the readings are the simulated joints in LeRobot's degrees
    assert obs["state"].numpy() == pytest.approx(profile_units().to_profile(env.qpos[:, :6]), abs=1e-4)
    assert obs[PRIVILEGED_KEY].numpy() == pytest.approx(env._state_obs(), abs=1e-5)
    assert env.single_observation_space["state"].shape == (6,)
    env.close()


def test_the_profile_runs_at_30_hz_with_the_servo_limits_on():
    env = rlrobot.make("so101-lift", 1, obs_mode="lerobot", control_mode="joint_pos")
    assert env.control_dt == pytest.approx(1 / 30) and env.frame_skip == 8 and env.model.opt.timestep == pytest.approx(1 / 240)
    assert env.servo_limits
    env.close()
    assert rlrobot.make("so101-lift", 1).control_dt == pytest.approx(0.04)  # the task as shipped is unchanged


def test_frames_are_cropped_then_resized_the_same_way_for_real_and_simulated_cameras():
    rng = np.random.default_rng(1)
    crop = centred_square(480, 640)
    real = rng.integers(0, 255, (480, 640, 3), dtype=np.uint8)
    top, left, h, w = crop_box(480, 640, crop)
    assert (top, left, h, w) == (0, 80, 480, 480)
    from PIL import Image

    expected = np.asarray(Image.fromarray(real[:, 80:560]).resize((64, 64), Image.Resampling.BOX))
    assert np.array_equal(prepare_frames(real, crop, 64), expected)
    # the simulator renders at a size whose crop is exactly the policy's: the same function returns it untouched
    shape = render_shape(64, (480, 640), crop)
    assert shape == (64, 85)
    small = rng.integers(0, 255, (*shape, 3), dtype=np.uint8)
    t, lft, _, _ = crop_box(*shape, crop)
    assert np.array_equal(prepare_frames(small, crop, 64), small[t:t + 64, lft:lft + 64])
    with pytest.raises(ValueError, match=r"camera frames must be \[..., H, W, 3\] uint8"):
        prepare_frames(real.astype(np.float32), crop, 64)


def test_the_observation_delay_shows_the_reading_of_the_step_before():
    setup = quiet_setup(physics={"friction": [1, 1], "object_mass": [1, 1], "observation_delay_steps": [1, 1]})
    env = rlrobot.make("so101-reach", 1, seed=0, obs_mode="lerobot", control_mode="joint_pos", setup=setup)
    obs, _ = env.reset(seed=0)
    readings = [profile_units().to_profile(env.qpos[0, :6])]
    for k in range(5):
        action = torch.full((1, 6), 0.3 if k % 2 else -0.3)
        obs, *_ = env.step(action)
        readings.append(profile_units().to_profile(env.qpos[0, :6]))
        assert obs["state"][0].numpy() == pytest.approx(readings[-2], abs=1e-4)  # one step old
    env.close()


def test_the_actuation_latency_applies_the_targets_of_two_steps_before():
    setup = quiet_setup(physics={"friction": [1, 1], "object_mass": [1, 1], "actuation_latency_steps": [2, 2]})
    env = rlrobot.make("so101-reach", 1, seed=0, obs_mode="state", control_mode="joint_pos", setup=setup)
    env.reset(seed=0)
    start = env.applied_ctrl[0].copy()
    targets = []
    for k in range(4):
        env.step(torch.full((1, 6), -0.5 + 0.3 * k))
        targets.append(env.ctrl[0].copy())
    assert env.applied_ctrl[0] == pytest.approx(targets[1])  # at step 4 the servos get step 2's targets
    assert not np.allclose(targets[1], targets[3]) and not np.allclose(start, targets[1])
    env.close()


def test_the_home_pose_reads_what_lerobot_would_report():
    """shoulder_lift 0.31 rad = 17.77 LeRobot degrees; the gripper at 0.6 rad is 40.3 % open."""
    reading = profile_units().to_profile(HOME_QPOS)
    assert reading[1] == pytest.approx(math.degrees(0.31) * 4096 / 4095)
    assert reading[5] == pytest.approx((0.6 - JOINT_LOW[5]) / (JOINT_HIGH[5] - JOINT_LOW[5]) * 100)
