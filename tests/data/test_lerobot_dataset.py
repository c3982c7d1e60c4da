"""LeRobotDataset v3.0 writer / reader: round trip, crash safety, bad input, and LeRobot itself where installed."""

import json

import numpy as np
import pytest

from rlrobot.data.lerobot_dataset import LeRobotDatasetWriter, read_lerobot_dataset

FEATURES = {
    "observation.state": {"dtype": "float32", "shape": [4], "names": None},
    "action": {"dtype": "float32", "shape": [2], "names": ["x", "y"]},
    "observation.images.front": {"dtype": "image", "shape": [8, 8, 3], "names": ["height", "width", "channels"]},
    "done": {"dtype": "bool", "shape": [1], "names": None},
}


def write(root, episodes=(5, 3)):
    rng = np.random.default_rng(0)
    w = LeRobotDatasetWriter(root, fps=25, features=FEATURES, robot_type="so101_follower")
    frames = []
    for e, n in enumerate(episodes):
        for i in range(n):
            f = {"observation.state": rng.normal(size=4).astype(np.float32), "action": rng.normal(size=2).astype(np.float32),
                 "observation.images.front": rng.integers(0, 256, (8, 8, 3), dtype=np.uint8), "done": np.array([i == n - 1])}
            w.add_frame(f, task="reach the target" if e % 2 == 0 else "push the cube")
            frames.append(f)
        w.save_episode()
    return w, frames


def test_round_trip(tmp_path):
    _, frames = write(tmp_path / "ds")
    ds = read_lerobot_dataset(tmp_path / "ds")
    info = ds["info"]
    assert info["codebase_version"] == "v3.0" and info["total_episodes"] == 2 and info["total_frames"] == 8
    assert info["fps"] == 25 and info["splits"] == {"train": "0:2"}
    f = ds["frames"]
    assert np.array_equal(f["observation.state"], np.stack([x["observation.state"] for x in frames]))
    assert np.array_equal(f["observation.images.front"], np.stack([x["observation.images.front"] for x in frames]))
    assert f["episode_index"].tolist() == [0] * 5 + [1] * 3 and f["frame_index"].tolist() == [0, 1, 2, 3, 4, 0, 1, 2]
    assert np.allclose(f["timestamp"], np.array([0, 1, 2, 3, 4, 0, 1, 2]) / 25)
    assert f["index"].tolist() == list(range(8))
    assert ds["tasks"] == {"reach the target": 0, "push the cube": 1} and f["task_index"].tolist() == [0] * 5 + [1] * 3
    ep = ds["episodes"]
    assert [e["length"] for e in ep] == [5, 3] and ep[1]["dataset_from_index"] == 5 and ep[1]["dataset_to_index"] == 8
    stats = json.loads((tmp_path / "ds" / "meta" / "stats.json").read_text())
    states = f["observation.state"]
    assert np.allclose(stats["observation.state"]["mean"], states.mean(0), atol=1e-5)
    assert np.allclose(stats["observation.state"]["std"], states.std(0), atol=1e-5)
    assert stats["observation.state"]["count"] == [8]
    assert np.array(stats["observation.images.front"]["mean"]).shape == (3, 1, 1)


def test_dataset_on_disk_is_complete_after_each_episode(tmp_path):
    w, _ = write(tmp_path / "ds", episodes=(4,))
    w.add_frame({"observation.state": np.zeros(4, np.float32), "action": np.zeros(2, np.float32),
                 "observation.images.front": np.zeros((8, 8, 3), np.uint8), "done": np.array([False])}, "t")
    # the process dies here, mid-episode: what was saved is readable and consistent
    ds = read_lerobot_dataset(tmp_path / "ds")
    assert ds["info"]["total_frames"] == 4 and len(ds["frames"]["index"]) == 4


def test_bad_input(tmp_path):
    w = LeRobotDatasetWriter(tmp_path / "a", 10, {"x": {"dtype": "float32", "shape": [2]}})
    with pytest.raises(ValueError, match="missing"):
        w.add_frame({}, "t")
    with pytest.raises(ValueError, match="shape"):
        w.add_frame({"x": np.zeros(3)}, "t")
    with pytest.raises(ValueError, match="no frames"):
        w.save_episode()
    with pytest.raises(FileExistsError):
        LeRobotDatasetWriter(tmp_path / "a", 10, {"x": {"dtype": "float32", "shape": [2]}})
    with pytest.raises(ValueError, match="reserved"):
        LeRobotDatasetWriter(tmp_path / "b", 10, {"index": {"dtype": "int64", "shape": [1]}})
    with pytest.raises(ValueError, match="dtype"):
        LeRobotDatasetWriter(tmp_path / "c", 10, {"x": {"dtype": "video", "shape": [2]}})


def test_lerobot_opens_our_dataset(tmp_path):
    pytest.importorskip("lerobot", reason="lerobot is not installed (optional extra: pip install 'rlrobot[lerobot]')")
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    _, frames = write(tmp_path / "ds")
    ds = LeRobotDataset("local/rlrobot_test", root=tmp_path / "ds")
    assert ds.num_episodes == 2 and ds.num_frames == 8 and ds.fps == 25
    item = ds[6]
    assert np.allclose(item["observation.state"].numpy(), frames[6]["observation.state"])
    assert item["task"] == "push the cube"
