"""Issue 14, item 12: a recorded episode appears all at once, after a failure inside ``save_episode`` and after a
crash of the process in the middle of it."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from rlrobot.data import lerobot_dataset
from rlrobot.data.lerobot_dataset import read_lerobot_dataset
from rlrobot.real_robot.recorder import EpisodeRecorder, read_recording, repair_recording


def record(recorder, n=30, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        reading = {"qpos": rng.normal(size=6)}
        recorder.add_frame(reading, {"state": rng.normal(size=(1, 9))}, rng.normal(size=4), rng.normal(size=6), "reach", 0)


def new_recorder(root):
    return EpisodeRecorder(root, 25, 9, 4, tuple(f"j{i}" for i in range(6)))


def consistent(ds, episodes, frames):
    return (ds["info"]["total_episodes"] == episodes and ds["info"]["total_frames"] == frames
            and len(ds["episodes"]) == episodes and len(ds["frames"]["index"]) == frames)


@pytest.mark.parametrize("fail_at", ["after the data file", "after the episode table"])
def test_a_failure_inside_save_episode_leaves_the_last_committed_dataset(tmp_path, monkeypatch, fail_at):
    rec = new_recorder(tmp_path / "ds")
    record(rec)
    rec.save_episode()
    record(rec, seed=1)
    original_write_meta = lerobot_dataset.LeRobotDatasetWriter._write_meta
    original_atomic = lerobot_dataset._atomic_write_text

    def crash(*args, **kwargs):
        raise OSError("disk full")

    if fail_at == "after the data file":
        monkeypatch.setattr(lerobot_dataset.LeRobotDatasetWriter, "_write_meta", crash)
    else:  # the writer rewrites info.json first: fail at stats.json, with info.json already ahead of the table
        def atomic(path, text):
            if path.name == "stats.json":
                raise OSError("disk full")
            return original_atomic(path, text)

        monkeypatch.setattr(lerobot_dataset, "_atomic_write_text", atomic)
    with pytest.raises(OSError, match="disk full"):
        rec.save_episode()
    monkeypatch.setattr(lerobot_dataset.LeRobotDatasetWriter, "_write_meta", original_write_meta)
    monkeypatch.setattr(lerobot_dataset, "_atomic_write_text", original_atomic)
    # the plain reader (and LeRobot's, which reads every data file) sees exactly the committed episode
    assert consistent(read_lerobot_dataset(tmp_path / "ds"), 1, 30)
    assert not (tmp_path / "ds" / "meta" / ".journal").exists()
    # and the recorder goes on from there
    record(rec, seed=2)
    assert rec.save_episode() == 1
    ds = read_lerobot_dataset(tmp_path / "ds")
    assert consistent(ds, 2, 60) and sorted(set(ds["frames"]["episode_index"])) == [0, 1]


def test_a_crash_mid_save_is_repaired_and_the_reader_trusts_the_metadata(tmp_path):
    """The process dies (os._exit) after the data file of episode 2 is written, before its metadata."""
    root = tmp_path / "ds"
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {os.path.dirname(os.path.dirname(os.path.dirname(__file__)))!r})
        from rlrobot.data import lerobot_dataset
        from tests.real_robot.test_recorder import new_recorder, record
        rec = new_recorder({str(root)!r})
        record(rec)
        rec.save_episode()
        record(rec, seed=1)
        lerobot_dataset.LeRobotDatasetWriter._write_meta = lambda self: os._exit(3)
        rec.save_episode()
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert p.returncode == 3, p.stderr
    assert (root / "data" / "chunk-000" / "file-001.parquet").is_file()  # the orphan the crash left
    assert read_recording(root, repair=False)["orphan_frames"] == 30  # trusted metadata: ignored even unrepaired
    assert consistent(read_recording(root, repair=False), 1, 30)
    assert repair_recording(root) and not repair_recording(root)  # idempotent
    assert not (root / "data" / "chunk-000" / "file-001.parquet").exists()
    ds = read_lerobot_dataset(root)
    assert consistent(ds, 1, 30) and read_recording(root)["orphan_frames"] == 0
