"""LeRobotDataset (codebase v3.0) writer and reader that need neither lerobot nor the hub.

The on-disk layout is LeRobot's own, so ``lerobot.datasets.LeRobotDataset(repo_id, root=DIR)`` opens what we write:

    meta/info.json                          codebase_version, fps, features, totals, path templates
    meta/stats.json                         per-feature min / max / mean / std / count / q01..q99
    meta/tasks.parquet                      task strings (the index) -> task_index
    meta/episodes/chunk-000/file-000.parquet one row per episode: length, tasks, frame range, data file, stats/...
    data/chunk-000/file-NNN.parquet          frames: features + timestamp, frame_index, episode_index, index, task_index

Vector features are fixed-size float32 / int64 / bool lists; ``image`` features are PNG bytes inside the parquet
(LeRobot's image dtype, no video encoding). Each episode goes to its own data file.

Crash consistency for every reader (LeRobot, pyarrow, ours): a save builds the next version of the whole dataset in a
sibling directory ``.<name>.staging`` (the existing files hard-linked, the new data file and all metadata written
there and synced), then swaps it with the dataset directory in one atomic step (``renameat2(RENAME_EXCHANGE)``) and
deletes the old version. Killed at any point, the directory holds either the previous or the new dataset, never a
mix. Where the exchange is not available (not Linux, or a file system without it) the swap is two renames, and
``recover_dataset`` puts the previous version back if a crash fell between them.
"""

from __future__ import annotations

import ctypes
import errno
import io
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

CODEBASE_VERSION = "v3.0"
CHUNK_SIZE = 1000  # files per chunk directory, LeRobot's default
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
EPISODES_PATH = "meta/episodes/chunk-000/file-000.parquet"
QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
VECTOR_DTYPES = ("float32", "float64", "int64", "int32", "bool")
DEFAULT_FEATURES = {
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}


def _require_arrow():
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as e:  # pragma: no cover - pyarrow is a dependency
        raise ImportError("writing LeRobotDatasets needs pyarrow: pip install pyarrow") from e
    return pa, pq


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _fsync(path: Path) -> None:
    """Flush a file or a directory to disk (best effort where a file system cannot sync directories)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def staging_dir(root: Path) -> Path:
    return root.parent / f".{root.name}.staging"


def retired_dir(root: Path) -> Path:
    return root.parent / f".{root.name}.retired"


RENAME_EXCHANGE = 2  # linux/fs.h


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two directories (Linux renameat2 RENAME_EXCHANGE); False where that is not available."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, f"cannot swap {a} and {b}: {os.strerror(err)}")


def _publish(staging: Path, root: Path) -> None:
    """Make the complete version in ``staging`` the dataset at ``root``: one atomic swap, then the old one goes."""
    if _exchange(staging, root):
        _fsync(root.parent)
        shutil.rmtree(staging)
        return
    retired = retired_dir(root)  # fallback: two renames; recover_dataset repairs a crash between them
    os.rename(root, retired)
    os.rename(staging, root)
    _fsync(root.parent)
    shutil.rmtree(retired)


def recover_dataset(root: str | Path) -> bool:
    """Clean up after a save that was killed: an unpublished staging copy is deleted, and (fallback swap only) the
    previous version is put back if the crash fell between its two renames. True if anything was found."""
    root = Path(root)
    found = False
    retired = retired_dir(root)
    if retired.is_dir():
        found = True
        if not root.exists():
            os.rename(retired, root)
        else:
            shutil.rmtree(retired)
    staging = staging_dir(root)
    if staging.exists():
        found = True
        shutil.rmtree(staging)
    return found


def _stage(root: Path, staging: Path) -> None:
    """A copy of the dataset at ``root`` in ``staging`` that shares the files' data (hard links; a copy where links
    are not possible). New versions of files are written next to it and renamed over it, never into it."""
    shutil.rmtree(staging, ignore_errors=True)
    for path in sorted(root.rglob("*")):
        target = staging / path.relative_to(root)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        elif not path.name.endswith(".tmp"):
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(path, target)
            except OSError:
                shutil.copy2(path, target)


def _stats(values: np.ndarray, image: bool) -> dict[str, list]:
    """LeRobot's per-feature statistics; images per channel, scaled to [0, 1], shaped (C, 1, 1)."""
    if image:  # [N, H, W, C] uint8 -> per channel
        x = values.reshape(-1, values.shape[-1]).astype(np.float64) / 255.0
        shape = (values.shape[-1], 1, 1)
    else:
        x = values.reshape(len(values), -1).astype(np.float64)
        shape = (x.shape[1],)
    out = {"min": x.min(0), "max": x.max(0), "mean": x.mean(0), "std": x.std(0)}
    out.update({f"q{int(q * 100):02d}": np.quantile(x, q, axis=0) for q in QUANTILES})
    stats = {k: v.reshape(shape).tolist() for k, v in out.items()}
    stats["count"] = [int(len(values))]
    return stats


def _merge_stats(a: dict[str, list] | None, b: dict[str, list]) -> dict[str, list]:
    """Combine two stats (count-weighted mean / variance; min / max exact; quantiles count-weighted, as LeRobot)."""
    if a is None:
        return b
    na, nb = a["count"][0], b["count"][0]
    n = na + nb
    out: dict[str, Any] = {"count": [n]}
    ma, mb = np.asarray(a["mean"]), np.asarray(b["mean"])
    mean = (na * ma + nb * mb) / n
    var = (na * (np.asarray(a["std"]) ** 2 + (ma - mean) ** 2) + nb * (np.asarray(b["std"]) ** 2 + (mb - mean) ** 2)) / n
    out.update(mean=mean.tolist(), std=np.sqrt(var).tolist(),
               min=np.minimum(a["min"], b["min"]).tolist(), max=np.maximum(a["max"], b["max"]).tolist())
    for k in a:
        if k.startswith("q"):
            out[k] = ((na * np.asarray(a[k]) + nb * np.asarray(b[k])) / n).tolist()
    return out


class LeRobotDatasetWriter:
    """``add_frame`` ... ``save_episode`` per episode; the dataset is complete after every ``save_episode``."""

    def __init__(self, root: str | Path, fps: float, features: dict[str, dict[str, Any]], robot_type: str | None = None):
        self.root = Path(root)
        if self.root.exists() and any(self.root.iterdir()):
            raise FileExistsError(f"{self.root} exists and is not empty; choose a new dataset directory")
        for name, ft in features.items():
            if name in DEFAULT_FEATURES:
                raise ValueError(f"feature {name!r} is reserved by the LeRobotDataset format")
            if ft["dtype"] not in (*VECTOR_DTYPES, "image"):
                raise ValueError(f"feature {name!r}: dtype {ft['dtype']!r} is not one of {(*VECTOR_DTYPES, 'image')}")
            if ft["dtype"] == "image" and (len(ft["shape"]) != 3 or ft["shape"][2] != 3):
                raise ValueError(f"image feature {name!r} needs shape [height, width, 3], got {ft['shape']}")
        self.fps = fps
        self.features = {k: {"dtype": v["dtype"], "shape": list(v["shape"]), "names": v.get("names")}
                         for k, v in features.items()}
        self.robot_type = robot_type
        self.tasks: dict[str, int] = {}
        self.episodes: list[dict[str, Any]] = []
        self.stats: dict[str, dict[str, list]] = {}
        self.total_frames = 0
        self._buffer: list[tuple[dict[str, Any], str]] = []
        recover_dataset(self.root)  # a staging copy left by a killed writer of the same name
        self._write_meta(self.root, [], {}, 0)

    def add_frame(self, frame: dict[str, Any], task: str) -> None:
        missing = set(self.features) - set(frame)
        extra = set(frame) - set(self.features)
        if missing or extra:
            raise ValueError(f"frame features do not match the dataset's: missing {sorted(missing)}, unknown {sorted(extra)}")
        for name, ft in self.features.items():
            shape = tuple(np.shape(frame[name]))
            if shape != tuple(ft["shape"]) and not (ft["shape"] == [1] and shape == ()):
                raise ValueError(f"feature {name!r} has shape {shape}, the dataset declares {tuple(ft['shape'])}")
        self._buffer.append((frame, task))

    def save_episode(self) -> int:
        if not self._buffer:
            raise ValueError("no frames were added to this episode")
        pa, pq = _require_arrow()
        episode_index = len(self.episodes)
        n = len(self._buffer)
        frames = [f for f, _ in self._buffer]
        tasks = [t for _, t in self._buffer]
        new_tasks = [t for t in dict.fromkeys(tasks) if t not in self.tasks]
        for t in new_tasks:
            self.tasks[t] = len(self.tasks)
        columns: dict[str, Any] = {}
        types: dict[str, Any] = {}
        episode_stats: dict[str, dict[str, list]] = {}
        for name, ft in self.features.items():
            if ft["dtype"] == "image":
                images = np.stack([np.asarray(f[name], np.uint8) for f in frames])
                columns[name] = [{"bytes": _png(img), "path": None} for img in images]
                types[name] = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
                episode_stats[name] = _stats(images, image=True)
                continue
            values = np.stack([np.asarray(f[name], dtype=ft["dtype"]).reshape(ft["shape"]) for f in frames])
            arrow_type = pa.from_numpy_dtype(np.dtype(ft["dtype"]))
            if ft["shape"] == [1]:
                columns[name], types[name] = values[:, 0], arrow_type
            else:
                columns[name] = list(values.reshape(n, -1))
                types[name] = pa.list_(arrow_type, int(np.prod(ft["shape"])))
            episode_stats[name] = _stats(values, image=False)
        frame_index = np.arange(n, dtype=np.int64)
        index = np.arange(self.total_frames, self.total_frames + n, dtype=np.int64)
        defaults = {"timestamp": (frame_index / self.fps).astype(np.float32), "frame_index": frame_index,
                    "episode_index": np.full(n, episode_index, np.int64), "index": index,
                    "task_index": np.array([self.tasks[t] for t in tasks], np.int64)}
        for name, values in defaults.items():
            columns[name], types[name] = values, pa.from_numpy_dtype(values.dtype)
            episode_stats[name] = _stats(values[:, None], image=False)
        table = pa.table({k: pa.array(columns[k], type=types[k]) for k in columns})

        chunk_index, file_index = divmod(episode_index, CHUNK_SIZE)
        row: dict[str, Any] = {"episode_index": episode_index, "tasks": sorted(set(tasks)), "length": n,
                               "data/chunk_index": chunk_index, "data/file_index": file_index,
                               "dataset_from_index": self.total_frames, "dataset_to_index": self.total_frames + n,
                               "meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0}
        for name, st in episode_stats.items():
            for key, value in st.items():
                row[f"stats/{name}/{key}"] = value
        stats = dict(self.stats)
        for name, st in episode_stats.items():
            stats[name] = _merge_stats(stats.get(name), st)
        episodes = [*self.episodes, row]
        total_frames = self.total_frames + n
        # the writer's state changes only once the new version is on disk: a failure leaves both as they were
        staging = staging_dir(self.root)
        try:
            _stage(self.root, staging)
            data_path = staging / DATA_PATH.format(chunk_index=chunk_index, file_index=file_index)
            data_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = data_path.with_name(f".{data_path.name}.tmp")
            pq.write_table(table, tmp, compression="snappy")
            os.replace(tmp, data_path)
            written = [data_path, *self._write_meta(staging, episodes, stats, total_frames)]
            for path in written:
                _fsync(path)
            for directory in {p.parent for p in written} | {staging}:
                _fsync(directory)
            _publish(staging, self.root)
        except BaseException:
            for task in new_tasks:
                del self.tasks[task]
            shutil.rmtree(staging, ignore_errors=True)
            raise
        self.episodes, self.stats, self.total_frames = episodes, stats, total_frames
        self._buffer.clear()
        return episode_index

    def discard_episode(self) -> None:
        self._buffer.clear()

    def _write_meta(self, root: Path, episodes: list[dict[str, Any]], stats: dict[str, dict[str, list]],
                    total_frames: int) -> list[Path]:
        """Write the metadata of a dataset with these episodes under ``root`` (each file under a temporary name,
        then renamed: a hard-linked previous version is never written into); the paths written."""
        info = {
            "codebase_version": CODEBASE_VERSION, "robot_type": self.robot_type,
            "total_episodes": len(episodes), "total_frames": total_frames, "total_tasks": len(self.tasks),
            "chunks_size": CHUNK_SIZE, "data_files_size_in_mb": 100, "video_files_size_in_mb": 200,
            "fps": self.fps, "splits": {"train": f"0:{len(episodes)}"} if episodes else {},
            "data_path": DATA_PATH, "video_path": None, "features": {**self.features, **DEFAULT_FEATURES},
        }
        (root / "meta").mkdir(parents=True, exist_ok=True)
        _atomic_write_text(root / "meta" / "info.json", json.dumps(info, indent=4))
        if not episodes:
            return [root / "meta" / "info.json"]
        _atomic_write_text(root / "meta" / "stats.json", json.dumps(stats, indent=4))
        import pandas as pd  # LeRobot reads tasks.parquet with pandas and looks tasks up by index

        tasks = pd.DataFrame({"task_index": list(self.tasks.values())}, index=list(self.tasks))
        tmp = root / "meta" / ".tasks.parquet.tmp"
        tasks.to_parquet(tmp)
        os.replace(tmp, root / "meta" / "tasks.parquet")
        pa, pq = _require_arrow()
        path = root / EPISODES_PATH
        path.parent.mkdir(parents=True, exist_ok=True)
        keys = list(episodes[0])
        table = pa.table({k: [e[k] for e in episodes] for k in keys})
        tmp = path.with_name(f".{path.name}.tmp")
        pq.write_table(table, tmp)
        os.replace(tmp, path)
        return [root / "meta" / name for name in ("info.json", "stats.json", "tasks.parquet")] + [path]


def _png(image: np.ndarray) -> bytes:
    import imageio.v3 as iio

    buf = io.BytesIO()
    iio.imwrite(buf, image, extension=".png")
    return buf.getvalue()


def read_lerobot_dataset(root: str | Path) -> dict[str, Any]:
    """Read a LeRobotDataset (v3.0 layout, parquet data) into numpy: {"info", "frames", "episodes", "tasks"}.

    ``frames`` maps each feature to an array over all frames in ``index`` order (images decoded to HxWx3 uint8).
    """
    pa, pq = _require_arrow()
    root = Path(root)
    info_path = root / "meta" / "info.json"
    if not info_path.is_file():
        raise FileNotFoundError(f"{root} is not a LeRobotDataset (no meta/info.json)")
    info = json.loads(info_path.read_text())
    if info.get("codebase_version") != CODEBASE_VERSION:
        raise ValueError(f"{root}: codebase_version {info.get('codebase_version')!r}; this reader reads {CODEBASE_VERSION}")
    paths = sorted(root.glob("data/*/*.parquet"))
    tables = [pq.read_table(p) for p in paths]
    frames: dict[str, np.ndarray] = {}
    if tables:
        table = pa.concat_tables(tables)
        order = np.argsort(table.column("index").to_numpy())
        for name, ft in info["features"].items():
            column = table.column(name).to_pylist()
            if ft["dtype"] == "video":
                continue
            if ft["dtype"] == "image":
                import imageio.v3 as iio

                values = np.stack([iio.imread(io.BytesIO(v["bytes"]), extension=".png") for v in column])
            else:
                values = np.asarray(column, dtype=ft["dtype"])
                if ft["shape"] != [1]:
                    values = values.reshape(len(column), *ft["shape"])
            frames[name] = values[order]
    episodes_path = root / EPISODES_PATH
    episodes = pq.read_table(episodes_path).to_pylist() if episodes_path.is_file() else []
    tasks_path = root / "meta" / "tasks.parquet"
    tasks: dict[str, int] = {}
    if tasks_path.is_file():
        import pandas as pd

        df = pd.read_parquet(tasks_path)
        tasks = {str(t): int(i) for t, i in zip(df.index, df["task_index"], strict=True)}
    return {"info": info, "frames": frames, "episodes": episodes, "tasks": tasks}
