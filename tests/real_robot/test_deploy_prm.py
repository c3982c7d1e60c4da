"""``rlrobot deploy --reward prm:PATH`` on the twin: the process reward model scores every control step, the numbers
go into the recorded LeRobotDataset (reward.progress / reward.delta / reward.done) and the report, and a PRM of
another observation space or a bad --reward is refused before the robot connects."""

import json

import numpy as np
import pytest
import torch

import rlrobot
from rlrobot.checkpoints import save_checkpoint
from rlrobot.data.lerobot_dataset import read_lerobot_dataset
from rlrobot.real_robot.deploy import DeployArgs, run_deploy
from rlrobot.real_robot.executor import ExecutorConfig
from rlrobot.rewards.progress_model import PRMNetConfig, VLACProgressModel, load_progress_model, prm_metadata


def tiny_prm(root, task):
    env = rlrobot.make(task, 1, seed=0)
    space = {k: list(v.shape) for k, v in env.single_observation_space.spaces.items()}
    env.close()
    torch.manual_seed(0)
    model = VLACProgressModel(space, PRMNetConfig(obs_keys=("state",), state_hidden=(16,), embed_dim=8, text_dim=8,
                                                  head_hidden=(16,)))
    for p in model.parameters():
        p.data.mul_(3.0)
    return save_checkpoint(root / task, "ckpt", model, {"prm": prm_metadata(model)})


def test_deploy_records_the_prm_progress_and_done_per_step(tmp_path, expert_checkpoint):
    prm = tiny_prm(tmp_path, "so101-reach")
    out = tmp_path / "summary.json"
    summary = run_deploy(DeployArgs(robot="twin", checkpoint=str(expert_checkpoint), episodes=2, max_steps=30,
                                    executor=ExecutorConfig(realtime=False), record=str(tmp_path / "rec"),
                                    reward=f"prm:{prm}", json_out=str(out)))
    assert summary["episodes"] == 2 and summary["reward"] == f"prm:{prm}"
    assert json.loads(out.read_text())["per_episode"][1]["prm_progress"] == summary["per_episode"][1]["prm_progress"]
    ds = read_lerobot_dataset(tmp_path / "rec")
    f = ds["frames"]
    assert ds["info"]["total_frames"] == 60
    for key in ("reward.progress", "reward.delta", "reward.done"):
        assert key in ds["info"]["features"] and f[key].shape[0] == 60 and np.isfinite(f[key]).all()
    assert ((f["reward.done"] >= 0) & (f["reward.done"] <= 1)).all() and (np.abs(f["reward.progress"]) <= 1).all()
    # the recorded numbers are the model's on the recorded observations: progress from each episode's first frame
    model = load_progress_model(prm)
    emb = torch.zeros(30, 384)  # so101-reach has no instruction embedding: a single-task PRM's zero embedding
    for episode in range(2):
        rows = f["episode_index"] == episode
        states = torch.as_tensor(f["observation.state"][rows])
        delta, done = model.progress({"state": states[:1].expand(30, -1)}, {"state": states}, emb)
        assert np.allclose(f["reward.progress"][rows].reshape(-1), delta.numpy(), atol=1e-5)
        assert np.allclose(f["reward.done"][rows].reshape(-1), done.numpy(), atol=1e-5)
        assert np.allclose(summary["per_episode"][episode]["prm_progress"], delta.numpy(), atol=1e-5)
        step, _ = model.progress({"state": states[:-1]}, {"state": states[1:]}, emb[1:])
        assert np.allclose(f["reward.delta"][rows].reshape(-1)[1:], step.numpy(), atol=1e-5)


def test_deploy_refuses_a_prm_of_another_observation_space_before_the_robot_moves(tmp_path, expert_checkpoint):
    other = tiny_prm(tmp_path, "so101-push")
    args = DeployArgs(robot="twin", checkpoint=str(expert_checkpoint), episodes=1, record=str(tmp_path / "rec"),
                      executor=ExecutorConfig(realtime=False), reward=f"prm:{other}")
    with pytest.raises(ValueError, match="PRM observation 'state' has shape"):
        run_deploy(args)
    assert not (tmp_path / "rec").exists()
    with pytest.raises(ValueError, match="must be prm:PATH"):
        run_deploy(DeployArgs(robot="twin", checkpoint=str(expert_checkpoint), reward="srpo"))
    with pytest.raises(ValueError, match="does not exist"):
        run_deploy(DeployArgs(robot="twin", checkpoint=str(expert_checkpoint), reward=f"prm:{tmp_path / 'nope'}"))
