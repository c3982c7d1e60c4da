"""Policies that read cameras on the robot side (a VLA or a flow policy trained on ``--obs-mode state+rgb``): the
sighted twin renders the cameras the policy reads, without a flag, exactly as training did; the bridge passes the
robot's frames by the policy's camera names (``--camera-map`` where they differ); deploy refuses at start, in one
line, a policy camera the robot lacks; a failed request's reason is in the summary without ``--verbose``."""

import gc
import json
import logging

import numpy as np
import pytest

import rlrobot
from rlrobot.cli import main
from rlrobot.real_robot.bridge import TaskBridge, parse_camera_map
from rlrobot.real_robot.drivers.twin import TwinRobot

from .conftest import TOKEN, ServerProcess
from .profile_checkpoints import profile_checkpoint

KEYS = ("state", "image_front", "image_wrist")
SHAPES = {"image_front": [3, 64, 64], "image_wrist": [3, 64, 64]}


@pytest.fixture(scope="module")
def camera_policy(tmp_path_factory):
    return profile_checkpoint(tmp_path_factory.mktemp("rgb"), KEYS, task="so101-reach", obs_mode="state+rgb")


def deploy(capsys, tmp_path, *args):
    gc.collect()  # renderers of earlier tests finalised here, not inside the CLI's docstring parsing (see conftest)
    out = tmp_path / "report.json"
    main(["deploy", "--robot", "twin", "--episodes", "1", "--max-steps", "20", "--executor.no-realtime",
          "--json-out", str(out), *args])
    captured = capsys.readouterr()
    return captured.out + captured.err, json.loads(out.read_text())


def test_the_sighted_twin_gives_the_policy_the_frames_it_was_trained_on():
    twin = TwinRobot("so101-reach", seed=3, policy_frames=64, blind=False)
    twin.connect()
    bridge = TaskBridge("so101-reach", "joint_pos", KEYS, image_shapes=SHAPES)
    env = rlrobot.make("so101-reach", 1, obs_mode="state+rgb", control_mode="joint_pos", seed=3, num_threads=1)
    try:
        reading = twin.observe()
        obs = bridge.observation(reading)
        trained, _ = env.reset(seed=3)  # the twin's first episode: the same scene, the same camera jitter
        for key in ("image_front", "image_wrist"):
            assert obs[key].dtype == np.uint8 and obs[key].shape == (1, 3, 64, 64)
            assert np.array_equal(obs[key], trained[key].numpy()), key
        np.testing.assert_allclose(obs["state"], trained["state"].numpy(), atol=1e-5)
        with pytest.raises(ValueError, match="no frame from camera 'wrist'"):
            bridge.observation({**reading, "images": {"front": reading["images"]["front"]}})
        with pytest.raises(ValueError, match="trained on"):
            bridge.observation({**reading, "images": {cam: f[::2, ::2] for cam, f in reading["images"].items()}})
    finally:
        twin.disconnect()
        bridge.close()
        env.close()


def test_a_camera_map_feeds_a_policy_camera_from_a_robot_camera_of_another_name():
    assert parse_camera_map("up=front, side=wrist") == {"up": "front", "side": "wrist"}
    for bad in ("up", "up=", "=front", "up=front,up=wrist"):
        with pytest.raises(ValueError, match="camera_map"):
            parse_camera_map(bad)
    bridge = TaskBridge("so101-reach", "joint_pos", ("state", "image_up"), {"up": "front"})
    try:
        assert bridge.cameras == ["up"] and bridge.robot_cameras == ["front"]
        frame = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
        obs = bridge.observation({"qpos": np.zeros(6), "qvel": np.zeros(6), "images": {"front": frame},
                                  "context": {}})
        assert np.array_equal(obs["image_up"][0], frame.transpose(2, 0, 1)) and "image_front" not in obs
    finally:
        bridge.close()


def test_deploy_on_the_twin_acts_on_every_step_with_a_policy_that_reads_cameras(camera_policy, tmp_path, capsys):
    text, report = deploy(capsys, tmp_path, "--checkpoint", str(camera_policy))
    assert report["steps"] == 20 and report["holds"] == 0 and report["inference_failures"] == 0
    assert report["first_failure"] is None and report["latched"] is None and "failed requests:" not in text


def test_deploy_through_the_server_sends_the_frames(camera_policy, tmp_path, capsys):
    server = ServerProcess(camera_policy)  # a real `rlrobot serve` on an OS-chosen loopback port
    try:
        text, report = deploy(capsys, tmp_path, "--server", server.url, "--token", TOKEN)
    finally:
        server.stop()
    assert report["steps"] == 20 and report["inference_failures"] == 0 and report["latched"] is None
    assert report["round_trip"]["count"] >= 5 and report["holds"] < report["steps"]


def test_a_policy_camera_the_robot_lacks_is_refused_at_start_in_one_line(camera_policy, capsys, monkeypatch):
    import rlrobot.real_robot.deploy as deploy_module

    monkeypatch.setattr(deploy_module, "make_robot", lambda *a, **k: pytest.fail("a robot was made"))
    with pytest.raises(SystemExit) as e:
        main(["deploy", "--robot", "twin", "--checkpoint", str(camera_policy), "--camera-map", "front=top"])
    assert e.value.code == 2
    captured = capsys.readouterr()
    lines = [line for line in (captured.out + captured.err).splitlines() if line.strip()]
    assert len(lines) == 1 and "reads camera 'front' (image_front)" in lines[0] and "'top'" in lines[0]
    assert "its cameras: front, wrist" in lines[0] and "refused" in lines[0]


def test_a_refused_request_says_why_without_verbose(camera_policy, tmp_path, capsys, monkeypatch):
    """A bridge that drops the frames (what deploy did before): every request is refused by the policy; the episode
    line and the summary give the refusal, with the executor's own warning silenced."""
    original = TaskBridge.observation
    monkeypatch.setattr(TaskBridge, "observation", lambda self, measured: {"state": original(self, measured)["state"]})
    monkeypatch.setattr(logging.getLogger("rlrobot.executor"), "disabled", True)
    text, report = deploy(capsys, tmp_path, "--checkpoint", str(camera_policy))
    reason = "ProtocolError: bad_request: obs['image_front'] is missing or not an array"
    assert report["inference_failures"] > 0 and report["holds"] == report["steps"] and report["first_failure"] == reason
    assert f"failed requests (the first: {reason})" in text
    assert f"failed requests: {report['inference_failures']}, the first because {reason}" in text


def test_a_profile_policy_camera_is_prepared_from_the_mapped_robot_camera():
    """In the LeRobot profile the frame of the policy's 'up' comes from the robot's 'front', cropped and resized with
    the setup's 'front' camera, exactly as the policy's 'front' would be."""
    from rlrobot.real_robot.profile_bridge import ProfileBridge
    from rlrobot.tasks.setup import load_setup

    setup = load_setup(None)
    h, w = setup.cameras["front"].resolution
    frame = np.random.default_rng(1).integers(0, 256, (h, w, 3), dtype=np.uint8)
    reading = {"qpos": np.zeros(6), "qvel": np.zeros(6), "images": {"front": frame}}
    mapped = ProfileBridge("so101-lift", "joint_pos", setup, ["state", "image_up"], {"up": "front"})
    plain = ProfileBridge("so101-lift", "joint_pos", setup, ["state", "image_front"])
    try:
        assert mapped.cameras == ["up"] and mapped.robot_cameras == ["front"]
        assert np.array_equal(mapped.observation(reading)["image_up"], plain.observation(reading)["image_front"])
    finally:
        mapped.close()
        plain.close()


def test_an_mlp_actor_that_reads_cameras_is_served_its_frames(tmp_path, capsys):
    """PPO's actor with --policy.image-keys: the loaded policy asks for its cameras, and deploy gives them."""
    from rlrobot.checkpoints import save_checkpoint
    from rlrobot.config import train_config
    from rlrobot.policies.actor_critic import ActorCriticConfig
    from rlrobot.policies.registry import build_policy, policy_metadata
    from rlrobot.real_robot.policy_runtime import LoadedPolicy

    cfg = train_config("ppo", task="so101-reach", obs_mode="state+rgb", control_mode="joint_pos", logger="none",
                       policy=ActorCriticConfig(actor_hidden=(16,), critic_hidden=(16,), image_keys=("image_front",)))
    env = rlrobot.make("so101-reach", 1, obs_mode="state+rgb", control_mode="joint_pos")
    meta = policy_metadata(cfg, env)
    env.close()
    ckpt = save_checkpoint(tmp_path / "ppo", "iter_000001", build_policy(meta, cfg), {"train": cfg.to_dict(), **meta})
    assert LoadedPolicy(str(ckpt)).metadata["obs_keys"] == ["state", "image_front"]
    _, report = deploy(capsys, tmp_path, "--checkpoint", str(ckpt))
    assert report["steps"] == 20 and report["holds"] == 0 and report["inference_failures"] == 0


def test_a_real_arm_policy_camera_is_checked_under_its_mapped_name():
    """A profile policy's 'up' camera on an arm whose cameras are front and wrist: refused without a map (the line
    says how to map it), accepted with up=front, refused when the map names a camera the arm lacks."""
    from rlrobot.real_robot.observation_check import observation_problem

    meta = {"task": "so101-lift", "obs_keys": ["state", "image_up"],
            "observation_space": {"state": [6], "image_up": [3, 64, 64], "privileged_state": [30]}}
    arm = {"front", "wrist"}
    problem = observation_problem(meta, "lerobot", arm, set())
    assert "reads camera 'up'" in problem and "--camera-map up=ROBOT_CAMERA" in problem and "\n" not in problem
    assert observation_problem(meta, "lerobot", arm, set(), {"up": "front"}) is None
    problem = observation_problem(meta, "lerobot", arm, set(), {"up": "top"})
    assert "mapped onto the robot's 'top'" in problem and "--lerobot-cameras top=INDEX_OR_PATH" in problem
