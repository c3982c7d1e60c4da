"""Deploying LeRobot-profile policies: the blind twin gives what a real arm gives and nothing else, deploy refuses
what no robot provides (privileged keys, missing cameras, the simulator state on a real arm) and arms far from the
trained start poses, --step-confirm holds until the operator says go, and a recording has LeRobot's layout."""

import numpy as np
import pytest

from rlrobot.cli import main
from rlrobot.data.lerobot_dataset import read_lerobot_dataset
from rlrobot.real_robot.deploy import DeployArgs, run_deploy, start_pose_problem
from rlrobot.real_robot.drivers.twin import READING_KEYS, TwinRobot
from rlrobot.real_robot.executor import ChunkExecutor, ExecutorConfig
from rlrobot.real_robot.policy_runtime import LoadedPolicy
from rlrobot.real_robot.profile_bridge import ProfileBridge
from rlrobot.real_robot.safety import SafetyConfig, SafetySupervisor
from rlrobot.tasks.profile import STATE_NAMES
from rlrobot.tasks.setup import load_setup
from rlrobot.tasks.so101 import HOME_QPOS, profile_units

from .fake_arm import FakeSO101
from .profile_checkpoints import profile_checkpoint

CAMERA_KEYS = ("state", "image_front", "image_wrist")


@pytest.fixture(scope="module")
def camera_policy(tmp_path_factory):
    return profile_checkpoint(tmp_path_factory.mktemp("camera-policy"), CAMERA_KEYS)


class Spy:
    """Wraps a robot or a policy source and keeps every reading it gives / every observation it is asked about."""

    def __init__(self, inner, method: str):
        self.inner, self.method, self.seen = inner, method, []

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if name != self.method:
            return attr

        def spy(*args, **kwargs):
            value = attr(*args, **kwargs)
            self.seen.append(args[0] if self.method == "infer" else value)
            return value

        return spy


def test_the_blind_twin_sends_the_policy_only_what_a_real_arm_reports(camera_policy):
    setup = load_setup(None)
    twin = TwinRobot("so101-lift", seed=3, setup=setup)
    twin.connect()
    robot = Spy(twin, "observe")
    policy = Spy(LoadedPolicy(str(camera_policy)), "infer")
    bridge = ProfileBridge("so101-lift", "joint_pos", setup, list(CAMERA_KEYS))
    sup = SafetySupervisor(SafetyConfig(), twin.joint_low, twin.joint_high, 1 / twin.control_rate_hz, bridge.tcp_position)
    executor = ChunkExecutor(robot, bridge, policy, sup, ExecutorConfig(realtime=False, mode="open_loop"))
    result = executor.run_episode(12)
    executor.close()
    assert result.steps == 12 and not result.aborted
    assert len(robot.seen) >= 13 and len(policy.seen) >= 3
    for reading in robot.seen:  # every key of every reading the twin sent
        assert set(reading) <= set(READING_KEYS) and "context" not in reading, sorted(reading)
        assert set(reading["images"]) == {"front", "wrist"}
        assert all(f.dtype == np.uint8 and f.shape == (120, 160, 3) for f in reading["images"].values())
    for obs in policy.seen:  # every observation the policy was given
        assert set(obs) == set(CAMERA_KEYS)
        assert obs["state"].shape == (1, 6) and obs["image_front"].shape == (1, 3, 64, 64)
    # the readings are the simulated joints in radians: the policy's state is them in LeRobot's degrees, with the
    # setup's reading noise (0.3 deg)
    qpos = twin.env.qpos[0, :6].copy()
    state = bridge.observation(twin.observe())["state"][0]
    assert np.abs(state - profile_units().to_profile(qpos)).max() < 3.0
    assert twin.success() in (True, False)  # success is the simulator's
    twin.disconnect()
    bridge.close()


def test_a_sighted_twin_still_gives_a_state_policy_its_task_context():
    twin = TwinRobot("so101-push", seed=0)
    twin.connect()
    reading = twin.observe()
    assert set(reading["context"]) == {"target", "cube_pos", "cube_quat"}
    twin.disconnect()


def test_deploy_refuses_a_privileged_actor_on_the_twin_and_the_arm_naming_the_key(tmp_path, capsys):
    ckpt = profile_checkpoint(tmp_path, ("state", "privileged_state"))
    for robot in ("twin", "lerobot"):
        with pytest.raises(SystemExit) as exit_info:
            main(["deploy", "--robot", robot, "--checkpoint", str(ckpt), "--lerobot-port", "/dev/null-port"])
        assert exit_info.value.code == 2
        lines = capsys.readouterr().out.strip().splitlines()
        assert len(lines) == 1 and "privileged observation 'privileged_state'" in lines[0], lines


def test_deploy_refuses_a_camera_the_robot_does_not_provide(tmp_path, camera_policy, capsys):
    setup = load_setup(None).to_dict()
    del setup["cameras"]["wrist"]
    (tmp_path / "station.json").write_text(__import__("json").dumps(setup))
    with pytest.raises(SystemExit):
        main(["deploy", "--robot", "twin", "--checkpoint", str(camera_policy), "--setup", str(tmp_path / "station.json")])
    line = capsys.readouterr().out.strip()
    assert "reads camera 'wrist' (image_wrist)" in line and "its cameras: front" in line
    with pytest.raises(SystemExit):  # a real arm without a device for a camera the policy reads
        main(["deploy", "--robot", "lerobot", "--checkpoint", str(camera_policy), "--lerobot-cameras", "front=0"])
    assert "reads camera 'wrist'" in capsys.readouterr().out


def test_a_lift_policy_of_the_simulator_state_is_refused_on_a_real_arm_but_runs_on_the_twin(tmp_path, capsys):
    ckpt = profile_checkpoint(tmp_path, ("state",), obs_mode="state")
    with pytest.raises(SystemExit):
        main(["deploy", "--robot", "lerobot", "--checkpoint", str(ckpt), "--target", "0.2", "0", "0.1"])
    line = capsys.readouterr().out.strip()
    assert "reads 'state', which for so101-lift holds simulator facts" in line and "privileged" in line
    summary = run_deploy(DeployArgs(robot="twin", checkpoint=str(ckpt), episodes=1, max_steps=5,
                                    executor=ExecutorConfig(realtime=False)))
    assert summary["twin"] == "sighted" and summary["steps"] == 5


def test_a_state_policy_trained_with_a_setup_meets_that_scene_on_the_sighted_twin(tmp_path):
    from rlrobot.tasks.setup import setup_text

    ckpt = profile_checkpoint(tmp_path, ("state",), obs_mode="state", setup=setup_text(str(load_setup(None).source)))
    summary = run_deploy(DeployArgs(robot="twin", checkpoint=str(ckpt), episodes=1, max_steps=3,
                                    executor=ExecutorConfig(realtime=False)))
    assert summary["twin"] == "sighted" and summary["steps"] == 3  # at the setup's 30 Hz, the policy's rate


def test_the_start_pose_check_refuses_an_arm_far_from_the_trained_start(expert_checkpoint, monkeypatch, capsys):
    assert start_pose_problem(HOME_QPOS, 0.25) is None
    far = HOME_QPOS + np.array([0, 0, 0, -0.6, 0, 0])
    assert "wrist_flex is at 0.92 rad, 0.55 rad outside" in start_pose_problem(far, 0.25)
    from rlrobot.real_robot import deploy as deploy_module
    from rlrobot.real_robot.drivers.lerobot import LeRobotArm

    arms = []

    def make(kind, **options):
        arms.append(FakeSO101(start=far))
        return LeRobotArm(robot=arms[-1], control_rate_hz=options["control_rate_hz"], context=options["context"])

    monkeypatch.setattr(deploy_module, "make_robot", make)
    with pytest.raises(SystemExit):
        main(["deploy", "--robot", "lerobot", "--checkpoint", str(expert_checkpoint), "--target", "0.18", "0.05", "0.08"])
    assert "refused to start: wrist_flex is at 0.92 rad" in capsys.readouterr().out
    assert arms[-1].sent == []  # nothing was ever commanded


def test_step_confirm_holds_until_the_operator_says_go_and_stop_latches(expert_checkpoint):
    from rlrobot.real_robot.bridge import TaskBridge

    twin = TwinRobot("so101-reach", seed=5)
    twin.connect()
    bridge = TaskBridge("so101-reach", "ee_delta")
    sup = SafetySupervisor(SafetyConfig(), twin.joint_low, twin.joint_high, 1 / twin.control_rate_hz, bridge.tcp_position)
    policy = LoadedPolicy(str(expert_checkpoint))
    executor = ChunkExecutor(twin, bridge, policy, sup, ExecutorConfig(realtime=False, step_confirm=True))
    waits: list[int] = []

    def operator(t):  # answers only after the arm was held for 5 ticks at the first chunk, then at once
        waits.append(t)
        if len(waits) == 1:
            executor.on_wait = lambda t: (waits.append(t), executor.operator.put("go"))
            import threading

            threading.Timer(5 * executor.dt, lambda: executor.operator.put("go")).start()

    executor.on_wait = operator
    result = executor.run_episode(4)
    kinds = [kind for _, kind, _ in twin.commands]
    assert result.steps == 4 and not result.aborted and result.confirmed_chunks == 4
    assert result.operator_waits >= 3 and kinds[:result.operator_waits] == ["hold"] * result.operator_waits
    assert kinds.count("act") == 4
    executor.on_wait = lambda t: executor.operator.put("stop")
    twin.reset_episode()
    result = executor.run_episode(4)
    assert result.aborted and result.latched and "operator stopped" in sup.estop_reason
    assert [kind for _, kind, _ in twin.commands][-1] == "disable"
    executor.close()
    twin.disconnect()
    bridge.close()


def test_a_profile_recording_on_the_blind_twin_has_lerobots_layout_and_units(camera_policy, tmp_path):
    summary = run_deploy(DeployArgs(robot="twin", checkpoint=str(camera_policy), episodes=2, max_steps=6, seed=4,
                                    record=str(tmp_path / "rec"), executor=ExecutorConfig(realtime=False)))
    assert summary["twin"] == "blind" and summary["steps"] == 12
    data = read_lerobot_dataset(tmp_path / "rec")
    features = data["info"]["features"]
    assert features["observation.state"]["names"] == list(STATE_NAMES) == features["action"]["names"]
    assert features["observation.images.front"]["shape"] == [64, 64, 3] and data["info"]["fps"] == 30
    frames = data["frames"]
    state, action = frames["observation.state"], frames["action"]
    assert state.shape == (12, 6) and frames["observation.images.wrist"].shape == (12, 64, 64, 3)
    # degrees and 0..100: the home pose's shoulder_lift is 17.8 deg, its gripper 40.3
    assert np.allclose(state[0], profile_units().to_profile(HOME_QPOS), atol=4.0)
    # the commands passed the supervisor: per step at most the servo's speed (4.7 rad/s at 30 Hz) in LeRobot's units
    step = profile_units().to_profile(np.full(6, 4.7 / 30)) - profile_units().to_profile(np.zeros(6))
    for episode in (action[:6], action[6:]):
        assert (np.abs(np.diff(episode, axis=0)) <= step + 1e-3).all()
    assert np.abs(np.diff(action[:6], axis=0)).max() > 0.5 * step.min()  # and they moved
