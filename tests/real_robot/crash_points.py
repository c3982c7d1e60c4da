"""Kill a dataset save at each of its file-system steps and look at what is left on disk.

``crash_at(k)`` makes the k-th file-system step of the save the last thing the process does: that step (or, with
``after=True``, the step after it) never happens, and neither does anything else the writer would do, its clean-up
included: what a SIGKILL or a power loss leaves. The steps are every call that changes the directory tree: writing
a file, a rename, a hard link, a copy, an unlink, a tree removal, the atomic exchange."""

from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from rlrobot.data import lerobot_dataset
from rlrobot.real_robot.recorder import EpisodeRecorder

JOINTS = tuple(f"j{i}" for i in range(6))


class Killed(BaseException):
    """The process 'died' here: nothing after this touches the disk."""


def new_recorder(root: Path) -> EpisodeRecorder:
    return EpisodeRecorder(root, 25, 9, 4, JOINTS)


def record(recorder: EpisodeRecorder, n: int = 30, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(n):
        reading = {"qpos": rng.normal(size=6)}
        recorder.add_frame(reading, {"state": rng.normal(size=(1, 9))}, rng.normal(size=4), rng.normal(size=6),
                           "reach" if seed % 2 == 0 else "push", 0)


@contextmanager
def crash_at(step: int, log: list[str]):
    """Within the block, the ``step``-th file-system step (1-based) kills the save; ``log`` names every step seen."""
    import pandas as pd
    import pyarrow.parquet as pq

    dead = [False]
    targets = [(os, "replace"), (os, "rename"), (os, "link"), (os, "unlink"), (shutil, "rmtree"), (shutil, "copy2"),
               (lerobot_dataset, "_exchange"), (pq, "write_table"), (pd.DataFrame, "to_parquet"), (Path, "write_text")]
    saved = [(owner, name, getattr(owner, name)) for owner, name in targets]

    def wrap(name, original):
        def step_fn(*args, **kwargs):
            if dead[0]:
                return None  # the process is gone: nothing reaches the disk any more
            target = args[1] if name in ("to_parquet", "write_table") else args[0]
            log.append(f"{name}({Path(str(target)).name})")
            if len(log) == step:
                dead[0] = True
                raise Killed(log[-1])
            return original(*args, **kwargs)
        return step_fn

    for owner, name, original in saved:
        setattr(owner, name, wrap(name, original))
    try:
        yield
    except Killed:
        pass
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


def pyarrow_view(root: Path) -> dict:
    """What a reader that opens every file sees: info.json's totals, every parquet's rows, stats.json's counts."""
    import pyarrow.parquet as pq

    info = json.loads((root / "meta" / "info.json").read_text())
    data = [pq.read_table(p) for p in sorted(root.glob("data/*/*.parquet"))]
    episode_rows = sum(pq.read_table(p).num_rows for p in sorted(root.glob("meta/episodes/*/*.parquet")))
    stats_path, tasks_path = root / "meta" / "stats.json", root / "meta" / "tasks.parquet"
    stats = json.loads(stats_path.read_text()) if stats_path.exists() else {}
    data_episodes = sorted({int(e) for t in data for e in t.column("episode_index").to_pylist()})
    return {"info_episodes": info["total_episodes"], "episode_rows": episode_rows, "data_episodes": len(data_episodes),
            "info_frames": info["total_frames"], "data_frames": sum(t.num_rows for t in data),
            "stats_frames": stats.get("index", {}).get("count", [0])[0],
            "tasks": pq.read_table(tasks_path).num_rows if tasks_path.exists() else 0,
            "info_tasks": info["total_tasks"]}


def version(view: dict) -> str:
    """"old" (1 episode, 30 frames), "new" (2, 60) or "torn: ..." for anything else."""
    for name, (episodes, frames, tasks) in {"old": (1, 30, 1), "new": (2, 60, 2)}.items():
        if view == {"info_episodes": episodes, "episode_rows": episodes, "data_episodes": episodes, "info_frames": frames,
                    "data_frames": frames, "stats_frames": frames, "tasks": tasks, "info_tasks": tasks}:
            return name
    return f"torn: {view}"


def save_killed_at(root: Path, step: int) -> tuple[list[str], bool]:
    """Record episode 1, then episode 2 killed at ``step``: (the steps seen, whether the save ran to its end)."""
    recorder = new_recorder(root)
    record(recorder)
    recorder.save_episode()
    record(recorder, seed=1)
    log: list[str] = []
    completed = False
    with crash_at(step, log):
        recorder.save_episode()
        completed = True
    return log, completed


def every_crash_point(tmp: Path, visit) -> list[tuple[int, str, object]]:
    """For k = 1, 2, ... until a save completes: kill the save at step k, then ``visit(root)``; the rows
    (k, step name, what visit returned)."""
    rows = []
    for k in range(1, 200):
        root = tmp / f"crash{k:03d}" / "ds"
        root.parent.mkdir(parents=True)
        log, completed = save_killed_at(root, k)
        rows.append((k, "completed" if completed else log[-1], visit(root)))
        if completed:
            return rows
    raise AssertionError("the save never completed")
