"""A recorded episode appears all at once, for every reader: after a failure inside ``save_episode``, and after the
process is killed at any step of it (pyarrow here; LeRobot's own LeRobotDataset in test_recorder_lerobot.py)."""

import os
import subprocess
import sys
import textwrap

import pytest

from rlrobot.data import lerobot_dataset
from rlrobot.data.lerobot_dataset import read_lerobot_dataset, staging_dir

from .crash_points import every_crash_point, new_recorder, pyarrow_view, record, version


def test_a_kill_at_every_step_of_a_save_leaves_the_old_or_the_new_dataset_for_pyarrow(tmp_path):
    rows = every_crash_point(tmp_path, lambda root: version(pyarrow_view(root)))
    print("\ncrash point -> what pyarrow sees (every parquet file and the JSON metadata)")
    for k, step, seen in rows:
        print(f"{k:3d}  {step:40s} {seen}")
    assert all(seen in ("old", "new") for _, _, seen in rows), [r for r in rows if r[2] not in ("old", "new")]
    exchange = next(k for k, step, _ in rows if step.startswith("_exchange"))
    assert all(seen == ("old" if k <= exchange else "new") for k, _, seen in rows)  # the exchange is the one switch


def test_a_killed_save_leaves_at_most_a_hidden_staging_copy_that_repair_removes(tmp_path):
    from rlrobot.real_robot.recorder import read_recording, repair_recording

    def visit(root):
        leftover = staging_dir(root).exists()
        ds = read_recording(root)  # repairs first
        return leftover, staging_dir(root).exists(), ds["info"]["total_episodes"], ds["orphan_frames"], repair_recording(root)

    rows = every_crash_point(tmp_path, visit)
    assert any(leftover for _, _, (leftover, *_rest) in rows)
    assert all(not after and orphans == 0 and not again for _, _, (_, after, _, orphans, again) in rows)


@pytest.mark.parametrize("fail_at", ["write_table", "to_parquet", "_exchange"])
def test_a_failure_inside_save_episode_leaves_the_last_saved_dataset(tmp_path, monkeypatch, fail_at):
    import pandas as pd
    import pyarrow.parquet as pq

    rec = new_recorder(tmp_path / "ds")
    record(rec)
    rec.save_episode()
    record(rec, seed=1)
    owner = {"write_table": pq, "to_parquet": pd.DataFrame, "_exchange": lerobot_dataset}[fail_at]

    def disk_full(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(owner, fail_at, disk_full)
    with pytest.raises(OSError, match="disk full"):
        rec.save_episode()
    monkeypatch.undo()
    assert version(pyarrow_view(tmp_path / "ds")) == "old" and not staging_dir(tmp_path / "ds").exists()
    record(rec, seed=2)  # and the recorder goes on from there
    assert rec.save_episode() == 1
    ds = read_lerobot_dataset(tmp_path / "ds")
    assert ds["info"]["total_episodes"] == 2 and sorted(set(ds["frames"]["episode_index"])) == [0, 1]


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_real_kill_around_the_exchange_leaves_a_consistent_dataset(tmp_path, when):
    """The process really dies (os._exit) just before or just after the atomic exchange."""
    root = tmp_path / "ds"
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {os.path.dirname(os.path.dirname(os.path.dirname(__file__)))!r})
        from rlrobot.data import lerobot_dataset
        from tests.real_robot.crash_points import new_recorder, record
        rec = new_recorder({str(root)!r})
        record(rec)
        rec.save_episode()
        record(rec, seed=1)
        exchange = lerobot_dataset._exchange
        def die(a, b):
            if {when!r} == "after":
                exchange(a, b)
            os._exit(3)
        lerobot_dataset._exchange = die
        rec.save_episode()
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert p.returncode == 3, p.stderr
    assert version(pyarrow_view(root)) == ("old" if when == "before" else "new")
    assert staging_dir(root).exists()  # the hidden leftover (the new version unpublished, or the old one)
