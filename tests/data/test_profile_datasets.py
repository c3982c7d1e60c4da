"""Datasets in the LeRobot SO-101 profile: a collection in our simulator and a dataset in the layout a real arm's
lerobot-record writes load alike for SFT, offline RL and the PRM, and train with --algo sft / bc / prm."""

import json

import numpy as np
import pytest

from rlrobot.commands.collect import CollectArgs, collect_demonstrations
from rlrobot.data.demonstrations import load_demonstrations
from rlrobot.data.lerobot_dataset import LeRobotDatasetWriter, read_lerobot_dataset
from rlrobot.data.transitions import is_profile_dataset, load_transitions
from rlrobot.tasks.profile import STATE_NAMES
from rlrobot.tasks.so101 import profile_units

SPACE = {"state": (6,), "image_front": (3, 64, 64), "image_wrist": (3, 64, 64)}
REAL_FRAME = (128, 160)
"""the 'real' camera's frames: the centred 128 square shrinks by 2 to the policy's 64, so upsampled frames come back"""
EPISODES = 2
"""of the collection's four, in the 'real' dataset"""


@pytest.fixture(scope="module")
def sim_dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("profile") / "lift"
    collect_demonstrations(CollectArgs(task="so101-lift", episodes=4, out=str(out), obs_mode="lerobot",
                                       control_mode="joint_pos", num_envs=4, seed=1))
    return out


@pytest.fixture(scope="module")
def real_format_dataset(sim_dataset, tmp_path_factory):
    """The collection's first episodes in the layout of a real arm's lerobot-record dataset: state, action and
    full-size camera frames only (no rewards, no success, no meta/rlrobot.json), each 64 px frame blown up 2x into a
    128x160 frame."""
    data = read_lerobot_dataset(sim_dataset)
    frames = data["frames"]
    features = {"observation.state": {"dtype": "float32", "shape": [6], "names": list(STATE_NAMES)},
                "action": {"dtype": "float32", "shape": [6], "names": list(STATE_NAMES)}}
    for cam in ("front", "wrist"):
        features[f"observation.images.{cam}"] = {"dtype": "image", "shape": [*REAL_FRAME, 3],
                                                 "names": ["height", "width", "channels"]}
    out = tmp_path_factory.mktemp("real") / "lift"
    writer = LeRobotDatasetWriter(out, 30, features, robot_type="so101_follower")
    names = {i: t for t, i in data["tasks"].items()}
    for e in np.unique(frames["episode_index"])[:EPISODES]:
        for i in np.nonzero(frames["episode_index"] == e)[0]:
            frame = {"observation.state": frames["observation.state"][i], "action": frames["action"][i]}
            for cam in ("front", "wrist"):
                big = np.zeros((*REAL_FRAME, 3), np.uint8)
                big[:, 16:144] = frames[f"observation.images.{cam}"][i].repeat(2, 0).repeat(2, 1)
                frame[f"observation.images.{cam}"] = big
            writer.add_frame(frame, names[int(frames["task_index"][i])])
        writer.save_episode()
    return out


def test_a_profile_collection_has_the_layout_of_a_real_arms_dataset(sim_dataset):
    data = read_lerobot_dataset(sim_dataset)
    info = data["info"]
    assert info["fps"] == 30 and info["robot_type"] == "so101_follower"
    features = info["features"]
    assert features["observation.state"]["names"] == list(STATE_NAMES) == features["action"]["names"]
    assert features["observation.images.front"]["shape"] == [64, 64, 3]
    assert not any("privileged" in k for k in features) and is_profile_dataset(features)
    meta = json.loads((sim_dataset / "meta" / "rlrobot.json").read_text())
    assert meta["use_degrees"] is True and meta["setup"]["control_rate_hz"] == 30
    # the action is the joint targets in LeRobot degrees (0..100 for the gripper): the expert closes it on the cube
    action = data["frames"]["action"]
    assert action[:, 5].min() == pytest.approx(0.0, abs=1e-4) and (action[:, :5] < 180).all()


def test_sft_reads_a_real_arms_dataset_like_the_collection(sim_dataset, real_format_dataset):
    keys = ("state", "image_front", "image_wrist")
    sim = load_demonstrations(sim_dataset, SPACE, 6, 4, keys, control_mode="joint_pos", task="so101-lift",
                              max_episodes=EPISODES)
    real = load_demonstrations(real_format_dataset, SPACE, 6, 4, keys, control_mode="joint_pos")
    for key in keys:  # the full-size frames go through prepare_frames: back to the policy's 64 px, exactly
        assert np.array_equal(sim.obs[key].numpy(), real.obs[key].numpy()), key
    assert np.array_equal(sim.chunks.numpy(), real.chunks.numpy())
    # actions are the task's joint_pos action: LeRobot's targets mapped onto [-1, 1]
    units = profile_units()
    targets = read_lerobot_dataset(sim_dataset)["frames"]["action"][:len(sim)]
    assert sim.chunks[:, 0].numpy() == pytest.approx(units.profile_to_normalized(targets), abs=1e-5)
    assert np.abs(sim.chunks.numpy()).max() <= 1.0


def test_offline_rl_reads_a_real_arms_dataset_like_the_collection(sim_dataset, real_format_dataset):
    common = dict(obs_shapes={"state": (6,)}, action_dim=6, task=None, control_mode="joint_pos", gamma=0.99)
    sim = load_transitions(sim_dataset, **common, max_episodes=EPISODES)
    real = load_transitions(real_format_dataset, **common)
    assert np.array_equal(sim.obs["state"].numpy(), real.obs["state"].numpy())
    assert np.array_equal(sim.actions.numpy(), real.actions.numpy())
    assert sim.has_rewards and not real.has_rewards  # a real arm records no reward: behaviour cloning only
    with pytest.raises(ValueError, match=r"absolute joint targets in LeRobot's units .* --control-mode joint_pos"):
        load_transitions(real_format_dataset, **{**common, "control_mode": "ee_delta"})


def test_the_prm_reads_the_profile_collection(sim_dataset):
    from rlrobot.data.progress_labels import load_progress_data

    data = load_progress_data(str(sim_dataset), ("state", "image_front"), {"state": (6,), "image_front": (3, 64, 64)})
    assert data.obs["state"].shape[1:] == (6,) and data.obs["image_front"].shape[1:] == (3, 64, 64)


SMALL = ["--num-envs", "2", "--num-threads", "1", "--logger", "none", "--no-video", "--eval-episodes", "2",
         "--eval-envs", "2", "--obs-mode", "lerobot", "--control-mode", "joint_pos", "--task", "so101-lift"]


@pytest.mark.slow
def test_a_profile_dataset_trains_with_sft_and_the_prm(sim_dataset, real_format_dataset, tmp_path):
    from rlrobot.cli import main

    for dataset, name in ((sim_dataset, "sim"), (real_format_dataset, "real")):
        out = tmp_path / f"sft-{name}"
        main(["train", "--algo", "sft", "--dataset", str(dataset), "--out", str(out), *SMALL, "--sft.num-updates", "40",
              "--sft.updates-per-iteration", "20", "--sft.batch-size", "32", "--flow.obs-keys", "state", "image_front",
              "--flow.chunk-size", "4", "--flow.execute-steps", "4", "--flow.denoising-steps", "2",
              "--flow.state-hidden", "32", "32", "--flow.embed-dim", "32", "--flow.velocity-hidden", "64", "64",
              "--flow.image-channels", "8", "8"])
        losses = [json.loads(x)["loss/flow_matching"] for x in (out / "metrics.jsonl").read_text().splitlines()
                  if "loss/flow_matching" in x]
        assert len(losses) == 2 and losses[-1] < losses[0]
    prm = tmp_path / "prm"
    main(["train", "--algo", "prm", "--dataset", str(sim_dataset), "--out", str(prm), *SMALL, "--prm.num-updates", "30",
          "--prm-net.obs-keys", "state", "image_front"])
    assert (prm / "checkpoints" / "latest").exists()


def test_a_profile_dataset_trains_with_bc(real_format_dataset, tmp_path):
    from rlrobot.cli import main

    out = tmp_path / "bc"
    main(["train", "--algo", "bc", "--dataset", str(real_format_dataset), "--out", str(out), *SMALL,
          "--bc.gradient-steps", "200"])
    assert (out / "checkpoints" / "latest").exists()
