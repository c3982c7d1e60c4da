"""The LeRobot SO-101 profile against LeRobot's own classes (runs where lerobot is installed: the LeRobot 0.6 venv in
CI; skipped in the main venv): the follower's features and lerobot-record's dataset features are the profile's names
and order; through LeRobot's real normalisation code (only the serial packets mocked, with a real arm's
calibration) the profile's state is exactly what LeRobot reports and the targets we send are what LeRobot writes;
the follower is built with its cameras; LeRobotDataset opens a profile collection and a profile deploy recording."""

import os

import numpy as np
import pytest

lerobot = pytest.importorskip("lerobot", reason="lerobot is not installed (the LeRobot venv runs this file)")
pytest.importorskip("scservo_sdk", reason="LeRobot's Feetech bus needs the feetech-servo-sdk package")
os.environ["HF_HUB_OFFLINE"] = "1"  # local datasets only: never the hub

from lerobot.motors import MotorCalibration  # noqa: E402
from lerobot.motors.feetech import FeetechMotorsBus  # noqa: E402
from lerobot.robots.so_follower import SO101Follower  # noqa: E402
from lerobot.utils.feature_utils import hw_to_dataset_features  # noqa: E402

from rlrobot.real_robot.drivers.lerobot import LeRobotArm  # noqa: E402
from rlrobot.real_robot.profile_bridge import ProfileBridge  # noqa: E402
from rlrobot.real_robot.profile_recorder import profile_features  # noqa: E402
from rlrobot.tasks.profile import STATE_NAMES, prepare_frames  # noqa: E402
from rlrobot.tasks.setup import load_setup  # noqa: E402
from rlrobot.tasks.so101 import JOINT_LOW, profile_units  # noqa: E402

# a real SO-101 follower's calibration (LeRobot's calibrate(): ranges of motion in raw ticks; wrist_roll a full turn)
CALIBRATION = {"shoulder_pan": (746, 3477), "shoulder_lift": (822, 3211), "elbow_flex": (901, 3110),
               "wrist_flex": (849, 3216), "wrist_roll": (0, 4095), "gripper": (1975, 3565)}


class Camera:
    """An OpenCV camera as the follower holds it: its configured size, a frame per read."""

    def __init__(self, height: int, width: int, seed: int):
        self.height, self.width, self.is_connected = height, width, True
        self.frame = np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)

    def read_latest(self):
        return self.frame

    def disconnect(self):
        self.is_connected = False


@pytest.fixture
def follower(monkeypatch):
    """LeRobot's SO101Follower, built by our driver with the setup's cameras, calibrated like a real arm; the serial
    bus answers with raw encoder ticks and records what is written (everything above the packets is LeRobot's)."""
    setup = load_setup(None)
    arm = LeRobotArm(use_degrees=True, control_rate_hz=30, cameras={
        name: {"device": str(k), "height": cam.resolution[0], "width": cam.resolution[1], "fps": cam.fps}
        for k, (name, cam) in enumerate(setup.cameras.items())})
    config = arm.follower_config()
    assert {n: (c.width, c.height, c.fps, str(c.index_or_path)) for n, c in config.cameras.items()} == \
        {"front": (640, 480, 30, "0"), "wrist": (640, 480, 30, "1")}
    robot = SO101Follower(config)
    robot.cameras = {name: Camera(cam.resolution[0], cam.resolution[1], k) for k, (name, cam) in enumerate(setup.cameras.items())}
    cal = {name: MotorCalibration(id=m.id, drive_mode=0, homing_offset=0, range_min=CALIBRATION[name][0],
                                  range_max=CALIBRATION[name][1]) for name, m in robot.bus.motors.items()}
    robot.bus.calibration = robot.calibration = cal
    ticks = {m.id: 2000 + 37 * m.id for m in robot.bus.motors.values()}
    written: list[dict[int, int]] = []
    monkeypatch.setattr(FeetechMotorsBus, "is_connected", property(lambda self: True))
    monkeypatch.setattr(robot.bus, "_sync_read", lambda addr, length, ids, **kw: ({i: ticks[i] for i in ids}, 0))
    monkeypatch.setattr(robot.bus, "_sync_write", lambda addr, length, values, **kw: written.append(dict(values)))
    arm._robot = robot
    arm.connect()
    return arm, robot, setup, ticks, written


def test_the_follower_reports_the_profiles_names_in_the_profiles_order(follower):
    _, robot, setup, _, _ = follower
    assert [k for k in robot.observation_features if k.endswith(".pos")] == list(STATE_NAMES)
    assert list(robot.action_features) == list(STATE_NAMES)
    assert robot.observation_features["front"] == (480, 640, 3)
    # what lerobot-record writes from them: the profile's dataset features (our recordings keep the policy's frames)
    recorded = {**hw_to_dataset_features(robot.observation_features, "observation", use_video=False),
                **hw_to_dataset_features(robot.action_features, "action")}
    ours = profile_features(setup.image_size, list(setup.camera_names))
    assert set(recorded) == set(ours)
    for key in ("observation.state", "action"):
        assert recorded[key]["names"] == ours[key]["names"] == list(STATE_NAMES)
        assert list(recorded[key]["shape"]) == ours[key]["shape"] == [6]
    assert recorded["observation.images.front"]["names"] == ours["observation.images.front"]["names"]


def test_the_profiles_state_is_what_lerobot_reports_and_its_frames_are_prepared_once(follower):
    arm, robot, setup, _, _ = follower
    lerobot_says = robot.get_observation()
    reading = arm.observe()
    bridge = ProfileBridge("so101-lift", "joint_pos", setup, ["state", "image_front", "image_wrist"])
    obs = bridge.observation(reading)
    bridge.close()
    expected = np.array([lerobot_says[name] for name in STATE_NAMES])
    assert obs["state"][0] == pytest.approx(expected, abs=1e-4)
    for cam in ("front", "wrist"):
        frame = prepare_frames(robot.cameras[cam].frame, setup.cameras[cam].crop_fractions(), 64)
        assert np.array_equal(obs[f"image_{cam}"][0], frame.transpose(2, 0, 1))


def test_the_targets_we_send_are_what_lerobot_writes_and_closed_is_closed(follower):
    arm, robot, _, _, written = follower
    units = profile_units()
    targets = np.array([10.0, -20.0, 30.0, 45.0, -90.0, 0.0])  # LeRobot degrees, the gripper closed
    arm.act(units.to_radians(targets))
    sent = written[-1]
    expected = robot.bus._unnormalize({robot.bus.motors[n.removesuffix(".pos")].id: v for n, v in zip(STATE_NAMES, targets,
                                                                                                     strict=True)})
    assert {i: abs(sent[i] - expected[i]) <= 1 for i in sent} == {i: True for i in expected}
    assert sent[robot.bus.motors["gripper"].id] == CALIBRATION["gripper"][0]  # 0 = the calibrated closed end
    arm.act(np.r_[np.zeros(5), JOINT_LOW[5]])  # the model's closed gripper
    assert written[-1][robot.bus.motors["gripper"].id] == CALIBRATION["gripper"][0]


def test_lerobots_dataset_opens_a_profile_collection_and_a_profile_recording(tmp_path):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from rlrobot.commands.collect import CollectArgs, collect_demonstrations
    from rlrobot.data.lerobot_dataset import read_lerobot_dataset

    out = tmp_path / "collected"
    collect_demonstrations(CollectArgs(task="so101-reach", episodes=1, out=str(out), obs_mode="lerobot",
                                       control_mode="joint_pos", num_envs=1))
    ds = LeRobotDataset("local/profile", root=out)
    assert ds.fps == 30 and ds.features["observation.state"]["names"] == list(STATE_NAMES)
    ours = read_lerobot_dataset(out)["frames"]
    item = ds[3]
    assert item["observation.state"].numpy() == pytest.approx(ours["observation.state"][3])
    assert item["action"].numpy() == pytest.approx(ours["action"][3])
    assert tuple(item["observation.images.front"].shape) == (3, 64, 64)  # channels first, in [0, 1]
    assert np.abs(item["observation.images.front"].numpy() * 255 - ours["observation.images.front"][3].transpose(2, 0, 1)
                  ).max() < 1.0
    from rlrobot.real_robot.deploy import DeployArgs, run_deploy
    from rlrobot.real_robot.executor import ExecutorConfig

    from .profile_checkpoints import profile_checkpoint

    policy = profile_checkpoint(tmp_path / "policy", ("state", "image_front"))
    run_deploy(DeployArgs(robot="twin", checkpoint=str(policy), episodes=1, max_steps=5, record=str(tmp_path / "rec"),
                          executor=ExecutorConfig(realtime=False)))
    recording = LeRobotDataset("local/recording", root=tmp_path / "rec")
    assert recording.num_frames == 5 and recording.features["action"]["names"] == list(STATE_NAMES)
    assert recording[4]["observation.state"].numpy() == pytest.approx(
        read_lerobot_dataset(tmp_path / "rec")["frames"]["observation.state"][4])
