"""The offline-RL transition loader (rlrobot.data.transitions): h-step windows and MC returns on hand-made sequences,
termination kept apart from time-outs, real LeRobotDatasets written by the writer, by `rlrobot collect --recipe` and
by `rlrobot deploy --record`, and the refusals of data that does not fit the task."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from rlrobot.config import train_config
from rlrobot.data.lerobot_dataset import LeRobotDatasetWriter
from rlrobot.data.transitions import from_arrays, load_transitions

STATE = {"state": (3,)}


def hand_made(gamma=0.5):
    """Two episodes: frames 0-4 (rewards 0..4) time out, frames 5-7 (rewards 5..7) terminate; state = frame index."""
    n = 8
    episode = np.array([0] * 5 + [1] * 3)
    last = np.array([0, 0, 0, 0, 1, 0, 0, 1], bool)
    return from_arrays(np.arange(n, dtype=np.float32)[:, None], np.arange(n, dtype=np.float32)[:, None] / 10,
                       np.arange(n, dtype=np.float32), episode, last & (episode == 1), last & (episode == 0),
                       np.zeros(n, bool), gamma=gamma)


def test_mc_returns_next_obs_and_episode_ends_on_a_hand_made_sequence():
    d = hand_made()
    assert d.mc_returns.tolist() == [1.625, 3.25, 4.5, 5.0, 4.0, 9.75, 9.5, 7.0]  # r_t + 0.5 r_{t+1} + ... per episode
    assert d.next_obs["state"][:, 0].tolist() == [1, 2, 3, 4, 4, 6, 7, 7]  # the last frame keeps its own obs
    assert d.terminals.tolist() == [False] * 7 + [True]
    assert d.truncations.tolist() == [False] * 4 + [True] + [False] * 3
    assert d.episode_stats() == {"episodes": 2, "transitions": 8, "success_rate": 0.0, "return_mean": 14.0,
                                 "episode_length": 4.0}


def test_h_step_windows_on_a_hand_made_sequence():
    d = hand_made()
    c = d.chunks_at(torch.tensor([0, 3, 5, 6]), horizon=3)
    assert c.rewards.tolist() == [[0, 1, 2], [3, 4, 0], [5, 6, 7], [6, 7, 0]]
    assert c.valid.tolist() == [[True] * 3, [True, True, False], [True] * 3, [True, True, False]]
    # padded with the episode's last action; s' = obs at t + h, or the final frame's s' where the episode ended
    assert torch.allclose(c.actions[1, :, 0], torch.tensor([0.3, 0.4, 0.4]))
    assert c.next_obs["state"][:, 0].tolist() == [3, 4, 7, 7]
    assert c.discount_h.tolist() == [0.125, 0.25, 0.125, 0.25]  # gamma ** valid steps
    assert c.terminals.tolist() == [False, False, True, True]
    assert c.truncations.tolist() == [False, True, False, False]
    assert c.obs["state"][:, 0].tolist() == [0, 3, 5, 6]
    batch = d.sample_chunks(64, 3, torch.Generator().manual_seed(0))
    assert batch.actions.shape == (64, 3, 1) and batch.valid[:, 0].all()


FEATURES = {"observation.state": {"dtype": "float32", "shape": [3]}, "action": {"dtype": "float32", "shape": [2]},
            "next.reward": {"dtype": "float32", "shape": [1]}, "next.done": {"dtype": "bool", "shape": [1]},
            "next.success": {"dtype": "bool", "shape": [1]}}


def write(root, episodes, features=FEATURES, meta=None):
    """A real LeRobotDataset: each episode (length, ends_terminated?) with state = [frame, episode, 0]."""
    w = LeRobotDatasetWriter(root, fps=10, features=features)
    for e, (length, terminated) in enumerate(episodes):
        for t in range(length):
            frame = {"observation.state": np.array([t, e, 0], np.float32), "action": np.full(2, 0.1 * t, np.float32),
                     "next.reward": np.array([1.0], np.float32), "next.done": np.array([t == length - 1]),
                     "next.success": np.array([t == length - 1 and e == 0])}
            if "next.terminated" in features:
                frame["next.terminated"] = np.array([t == length - 1 and terminated])
                frame["next.truncated"] = np.array([t == length - 1 and not terminated])
            w.add_frame(frame, "push")
        w.save_episode()
    if meta is not None:
        (root / "meta" / "rlrobot.json").write_text(json.dumps(meta))
    return root


def load(root, **kw):
    args = dict(obs_shapes=STATE, action_dim=2, task="so101-push", control_mode="ee_delta", gamma=0.9)
    return load_transitions(root, **{**args, **kw})


def test_the_loader_keeps_termination_and_time_out_apart(tmp_path):
    features = {**FEATURES, "next.terminated": {"dtype": "bool", "shape": [1]},
                "next.truncated": {"dtype": "bool", "shape": [1]}}
    d = load(write(tmp_path / "a", [(4, True), (5, False)], features))
    assert d.terminals.tolist() == [False, False, False, True] + [False] * 5
    assert d.truncations.tolist() == [False] * 8 + [True]
    assert d.mc_returns[0].item() == pytest.approx(1 + 0.9 + 0.81 + 0.729)
    assert d.success.tolist() == [False, False, False, True] + [False] * 5 and d.has_rewards
    # LeRobot's next.done alone: an episode that ends before max_episode_steps terminated, a full-length one timed out
    d = load(write(tmp_path / "b", [(4, True), (6, False)], meta={"task": "so101-push", "max_episode_steps": 6}))
    assert d.terminals.nonzero().flatten().tolist() == [3] and d.truncations.nonzero().flatten().tolist() == [9]
    # without a stored s', the time-out bootstraps from a copy of its own last observation: counted and said
    assert torch.equal(d.next_obs["state"][9], d.obs["state"][9])
    assert d.info["timeouts_without_next_obs"] == 1 and "1 time-out transition bootstrap" in d.bootstrap_note()


def test_datasets_that_do_not_fit_the_task_are_refused_naming_the_feature(tmp_path):
    meta = {"task": "so101-lift", "control_mode": "ee_delta"}
    root = write(tmp_path / "lift", [(3, False)], meta=meta)
    with pytest.raises(ValueError, match="recorded on task='so101-lift'.*trains task='so101-push'"):
        load(root)
    with pytest.raises(ValueError, match="control_mode='ee_delta'; the task runs control_mode='joint_pos'"):
        load(root, task="so101-lift", control_mode="joint_pos")
    with pytest.raises(ValueError, match=r"feature 'action' has shape \[2\]; task 'so101-lift' has action shape \[6\]"):
        load(root, task="so101-lift", action_dim=6)
    with pytest.raises(ValueError, match=r"'observation.state' has shape \[3\]; task 'so101-lift' observation 'state' needs \[9\]"):
        load(root, task="so101-lift", obs_shapes={"state": (9,)})
    LeRobotDatasetWriter(tmp_path / "empty", fps=10, features=FEATURES)
    with pytest.raises(ValueError, match="is empty"):
        load(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="not a LeRobotDataset"):
        load(tmp_path / "nothing")


def test_collect_recipe_writes_terminated_and_truncated_and_loads(tmp_path):
    from rlrobot.commands.collect import CollectArgs, collect_demonstrations

    out = tmp_path / "mixed"
    summary = collect_demonstrations(CollectArgs(task="so101-reach", recipe="mixed", episodes=4, out=str(out), num_envs=4,
                                                 seed=3))
    assert summary["recipe"] == "mixed" and summary["episodes"] == 4 and summary["expert_noise"] == 0.3
    assert sum(summary["episode_behaviours"].values()) == 4
    d = load(out, obs_shapes={"state": (27,)}, action_dim=5, task="so101-reach")
    assert len(d) == 200 and d.num_episodes == 4 and d.info["recipe"] == "mixed"  # 50-step episodes
    assert d.truncations.sum() == 4 and not d.terminals.any()  # reach never terminates: every episode times out
    assert d.actions.abs().max() <= 1.0
    # s' of a time-out is the episode's true final observation (stored), not a copy of its last frame's observation
    ends = torch.nonzero(d.truncations).flatten()
    assert d.info["stores_next_obs"] and "timeouts_without_next_obs" not in d.info and d.bootstrap_note() == ""
    assert not torch.equal(d.next_obs["state"][ends], d.obs["state"][ends])
    inner = torch.nonzero(~d.truncations).flatten()
    assert torch.equal(d.next_obs["state"][inner], d.obs["state"][inner + 1])  # s' of the other frames: the next frame
    with pytest.raises(ValueError, match="recipe='expart' is not a dataset recipe; recipes: expert, noisy-low"):
        collect_demonstrations(CollectArgs(task="so101-reach", recipe="expart", out=str(tmp_path / "x")))


def test_collect_with_expert_labels_stores_the_clean_label_and_transitions_read_the_executed_action(tmp_path):
    """DART (--label expert): the env runs expert + noise, `action` is the expert's noise-free action at the visited
    state (what SFT imitates), `action.executed` what ran (what the transitions take)."""
    from rlrobot.commands.collect import CollectArgs, collect_demonstrations
    from rlrobot.data.lerobot_dataset import read_lerobot_dataset

    out = tmp_path / "dart"
    summary = collect_demonstrations(CollectArgs(task="so101-reach", episodes=2, out=str(out), num_envs=2, seed=3,
                                                 noise=0.3, label="expert"))
    assert summary["action_label"] == "expert"
    d = load(out, obs_shapes={"state": (27,)}, action_dim=5, task="so101-reach")
    assert d.info["action_feature"] == "action.executed"
    frames = read_lerobot_dataset(out)["frames"]
    labels = torch.as_tensor(np.stack(frames["action"]))
    torch.testing.assert_close(torch.as_tensor(np.stack(frames["action.executed"])), d.actions)
    gap = (labels - d.actions).abs()
    assert 0.1 < gap.mean() < 0.5  # noise std 0.3, clipped at the action bounds
    with pytest.raises(ValueError, match="label='noisy' is not one of: executed, expert"):
        collect_demonstrations(CollectArgs(task="so101-reach", episodes=1, out=str(tmp_path / "x"), label="noisy"))


def test_a_dataset_recorded_by_deploy_loads_and_only_behaviour_cloning_trains_on_it(tmp_path):
    import importlib.util

    # the fixture builder lives in tests/real_robot/conftest.py (not importable as a package under plain `pytest`)
    spec = importlib.util.spec_from_file_location("real_robot_conftest",
                                                  Path(__file__).parents[1] / "real_robot" / "conftest.py")
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    reach_expert_checkpoint = conftest.reach_expert_checkpoint

    ckpt = reach_expert_checkpoint(tmp_path / "expert" / "checkpoints")
    rec = tmp_path / "rec"
    p = subprocess.run([sys.executable, "-m", "rlrobot", "deploy", "--robot", "twin", "--checkpoint", str(ckpt),
                        "--episodes", "2", "--max-steps", "15", "--executor.no-realtime", "--record", str(rec)],
                       capture_output=True, text=True, env={**os.environ, "MUJOCO_GL": "egl"}, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    d = load(rec, obs_shapes={"state": (27,)}, action_dim=5, task="so101-reach")
    assert len(d) == 30 and d.num_episodes == 2 and d.info["action_feature"] == "action.policy"  # not joint targets
    assert not d.has_rewards and not d.terminals.any() and d.truncations.nonzero().flatten().tolist() == [14, 29]
    assert d.actions.abs().max() <= 1.0 and d.actions.abs().sum() > 0
    from rlrobot.runners.offline import load_offline_data

    cfg = train_config("iql", task="so101-reach", dataset=str(rec))
    with pytest.raises(ValueError, match="has no 'next.reward' feature.*algo='iql' needs rewards"):
        load_offline_data(cfg, {"state": (27,)}, 5, "cpu")
    cfg = train_config("bc", task="so101-reach", dataset=str(rec))
    assert len(load_offline_data(cfg, {"state": (27,)}, 5, "cpu")) == 30
