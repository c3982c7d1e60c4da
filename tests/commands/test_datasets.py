"""`rlrobot datasets` and an offline run's header on a dataset that recorded no rewards or success (a deploy
recording): they say so instead of printing 0.00."""

import numpy as np

from rlrobot.commands.datasets import DatasetsArgs, describe_dataset, list_datasets
from rlrobot.config import train_config
from rlrobot.data.lerobot_dataset import LeRobotDatasetWriter
from rlrobot.runners.base import make_runner

STATE_DIM, ACTION_DIM = 27, 5  # so101-reach's


def recording_without_rewards(root):
    features = {"observation.state": {"dtype": "float32", "shape": [STATE_DIM]},
                "action": {"dtype": "float32", "shape": [ACTION_DIM]}, "next.done": {"dtype": "bool", "shape": [1]}}
    writer = LeRobotDatasetWriter(root, fps=25, features=features)
    rng = np.random.default_rng(0)
    for _ in range(2):
        for t in range(6):
            writer.add_frame({"observation.state": rng.normal(size=STATE_DIM).astype(np.float32),
                              "action": rng.uniform(-1, 1, ACTION_DIM).astype(np.float32), "next.done": np.array([t == 5])},
                             "reach the target")
        writer.save_episode()
    return root


def test_datasets_says_no_rewards_and_no_success_were_recorded_instead_of_blank_or_zero(tmp_path, capsys):
    root = recording_without_rewards(tmp_path / "rec")
    row = describe_dataset(root)
    assert row["episodes"] == 2 and row["success_rate"] is None and row["return_mean"] is None
    list_datasets(DatasetsArgs(paths=(str(root),)))
    out = capsys.readouterr().out
    assert "n/a (no rewards recorded)" in out and "n/a (no success recorded)" in out


def test_behaviour_cloning_on_such_a_recording_says_so_in_its_header(tmp_path, capsys):
    root = recording_without_rewards(tmp_path / "rec")
    cfg = train_config("bc", task="so101-reach", dataset=str(root), out=str(tmp_path / "bc"), logger="none", video=False,
                       eval_episodes=2, eval_envs=2)
    cfg.bc.gradient_steps, cfg.bc.updates_per_iteration, cfg.bc.batch_size = 2, 2, 4
    make_runner(cfg)
    out = capsys.readouterr().out
    assert "dataset success n/a (no success recorded), return n/a (no rewards recorded)" in out
    assert "0.00" not in out
