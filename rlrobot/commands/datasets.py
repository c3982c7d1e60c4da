"""``rlrobot datasets``: the offline-RL dataset recipes, and what each dataset given holds (episodes, transitions,
success rate and mean return), so a user sees what they train on."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tyro
from rich.console import Console

from rlrobot.data.recipes import RECIPES
from rlrobot.data.transitions import _read_columns, dataset_meta
from rlrobot.logging.tables import print_table
from rlrobot.runners.offline import NO_REWARDS, NO_SUCCESS

console = Console(soft_wrap=True)


@dataclass
class DatasetsArgs:
    paths: tyro.conf.Positional[tuple[str, ...]] = ()
    """LeRobotDataset directories to describe (none: every dataset under --root)"""
    root: str = "data/offline"
    """where `rlrobot offline-bench` and the README's collect commands write the recipes' datasets"""


def describe_dataset(root: str | Path) -> dict[str, Any]:
    """Episodes, transitions, success rate (an episode's last frame), mean return and the recipe of one dataset."""

    info, meta = dataset_meta(root)
    features = info.get("features", {})
    wanted = [n for n in ("next.reward", "next.success", "next.terminated") if n in features]
    cols = _read_columns(Path(root), info, wanted)
    row: dict[str, Any] = {"path": str(root), "task": meta.get("task"), "recipe": meta.get("recipe") or "-",
                           "episodes": 0, "transitions": 0, "success_rate": None, "return_mean": None, "terminated": None}
    if not cols:
        return row
    episode = cols["episode_index"].reshape(-1)
    ids, first = np.unique(episode, return_index=True)
    last = np.r_[first[1:] - 1, len(episode) - 1]
    row.update(episodes=len(ids), transitions=len(episode))
    if "next.success" in cols:
        row["success_rate"] = float(cols["next.success"].reshape(-1)[last].mean())
    if "next.reward" in cols:
        row["return_mean"] = float(np.add.reduceat(cols["next.reward"].reshape(-1).astype(np.float64), first).mean())
    if "next.terminated" in cols:
        row["terminated"] = int(cols["next.terminated"].reshape(-1).sum())
    return row


def list_datasets(args: DatasetsArgs) -> list[dict[str, Any]]:
    print_table(console, "dataset recipes (rlrobot collect --task T --recipe NAME --out DIR)", ("recipe", "episodes", "what"),
                [(r.name, str(r.episodes), r.summary) for r in RECIPES.values()])
    paths = [Path(p) for p in args.paths]
    if not paths and Path(args.root).is_dir():
        paths = sorted(p for p in Path(args.root).iterdir() if (p / "meta" / "info.json").is_file())
    rows = [describe_dataset(p) for p in paths]
    if rows:
        print_table(console, "datasets", ("dataset", "task", "recipe", "episodes", "transitions", "success", "return", "terminated"),
                    [(r["path"], str(r["task"] or "-"), r["recipe"], str(r["episodes"]), str(r["transitions"]),
                      NO_SUCCESS if r["success_rate"] is None else f"{r['success_rate']:.2f}",
                      NO_REWARDS if r["return_mean"] is None else f"{r['return_mean']:.2f}",
                      "-" if r["terminated"] is None else str(r["terminated"])) for r in rows])
    elif not args.paths:
        console.print(f"no datasets under {args.root} yet: rlrobot collect --task so101-push --recipe noisy "
                      f"--out {args.root}/so101-push_noisy")
    return rows
