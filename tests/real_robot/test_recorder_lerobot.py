"""LeRobot's own LeRobotDataset opens a recording after a kill at every step of a save, and sees the old or the new
dataset (runs where lerobot is installed: the LeRobot 0.6 venv in CI; skipped in the main venv)."""

import os

import pytest

from .crash_points import every_crash_point, pyarrow_view, version

lerobot = pytest.importorskip("lerobot", reason="lerobot is not installed (the LeRobot venv runs this file)")


def lerobot_view(root) -> str:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    os.environ["HF_HUB_OFFLINE"] = "1"  # a local dataset only: never the hub
    try:
        ds = LeRobotDataset("local/crash-point", root=root)
    except Exception as e:  # what a user would get
        return f"error: {type(e).__name__}: {str(e)[:120]}"
    episodes, frames = ds.num_episodes, ds.num_frames
    seen = {int(ds[i]["episode_index"]) for i in (0, len(ds) - 1)}
    name = {(1, 30): "old", (2, 60): "new"}.get((episodes, frames), f"torn: {episodes} episodes, {frames} frames")
    if len(ds) != frames or seen != set(range(episodes)) or len(ds.meta.episodes) != episodes:
        name = f"torn: {len(ds)} rows, episodes {seen}, {len(ds.meta.episodes)} episode rows"
    return name


def test_lerobot_sees_the_old_or_the_new_dataset_after_a_kill_at_every_step_of_a_save(tmp_path):
    rows = every_crash_point(tmp_path, lambda root: (version(pyarrow_view(root)), lerobot_view(root)))
    print(f"\nlerobot {lerobot.__version__}: crash point -> (pyarrow, LeRobotDataset)")
    for k, step, seen in rows:
        print(f"{k:3d}  {step:40s} {seen}")
    assert all(p == lr and p in ("old", "new") for _, _, (p, lr) in rows), rows
