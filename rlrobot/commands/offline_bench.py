"""``rlrobot offline-bench``: the offline-RL table, reproducible in one command.

tasks x recipes x algorithms x seeds at one gradient budget: each run is ``rlrobot train --algo A --task T --dataset
D`` from A's preset for T (budget, evaluation and output overridden), the datasets are written by ``rlrobot collect
--recipe`` when missing. Beside every result stand the dataset's own success / return and the deterministic behaviour
policy (the scripted expert without noise, evaluated on the same seeds), as NeoRL asks.

Results go to ``OUT/results.jsonl`` (one line per run, appended as runs finish: an interrupted benchmark resumes
where it stopped, and runs of other algorithms can be added later with another ``--algos``); ``OUT/table.md`` and
``OUT/curves.png`` are rebuilt from all lines each time (``--table-only`` rebuilds them without training).
Algorithms are discovered through the registry: every offline algorithm (``rlrobot.algorithms.offline``) can run.
Several processes started with the same arguments share the runs (each claims a run in ``OUT/claims/`` before it
starts it), so a machine with spare cores finishes sooner.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

import rlrobot
from rlrobot.algorithms.offline import offline_algorithm_names
from rlrobot.algorithms.registry import ALGORITHMS, algorithm_spec
from rlrobot.commands.collect import CollectArgs, collect_demonstrations
from rlrobot.configs import preset
from rlrobot.data.recipes import RECIPES, recipe
from rlrobot.envs.seeds import evaluation_seed
from rlrobot.runners.base import make_runner
from rlrobot.runners.evaluation import evaluate
from rlrobot.tasks.registry import native_task_ids, task_spec

console = Console(soft_wrap=True)


@dataclass
class OfflineBenchArgs:
    tasks: tuple[str, ...] = ("so101-push", "so101-lift")
    """native tasks with a scripted expert"""
    recipes: tuple[str, ...] = ("noisy", "mixed")
    """dataset recipes (rlrobot datasets lists them)"""
    algos: tuple[str, ...] = ()
    """offline algorithms to run (default: every registered one: rlrobot list-algos)"""
    seeds: tuple[int, ...] = (0,)
    """seeds of every algorithm"""
    seeds_for: tuple[str, ...] = ()
    """more seeds for some algorithms, e.g. iql:1,2 (3 seeds for IQL with --seeds 0)"""
    gradient_steps: int = 3000
    """the budget: gradient steps of every run"""
    evaluations: int = 3
    """evaluations over each run (the learning curves' points; the last is the table's)"""
    eval_episodes: int = 32
    """episodes of each evaluation (deterministic actions)"""
    eval_envs: int = 16
    """envs stepped at once in an evaluation"""
    data_root: str = "data/offline"
    """where the datasets are (written there by collect --recipe when missing: <task>_<recipe>)"""
    episodes: int = 0
    """episodes per dataset when it is written (0 = the recipe's default)"""
    out: str = "runs/offline_bench"
    """results.jsonl, table.md, curves.png and the runs' directories"""
    labelled_fraction: float = 1.0
    """semi-supervised runs: share of episodes that keep their actions (the rest labelled by inverse dynamics)"""
    update_threads: int = 1
    """torch threads of the updates (1 is fastest on a shared CPU)"""
    device: str = "cpu"
    """torch device of the learners"""
    table_only: bool = False
    """only rebuild table.md and curves.png from results.jsonl"""


def _parse_seeds_for(items: tuple[str, ...]) -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {}
    for item in items:
        algo, sep, seeds = item.partition(":")
        try:
            out[algo] = tuple(int(s) for s in seeds.split(",") if s)
        except ValueError:
            sep = ""
        if not sep or not out.get(algo):
            raise ValueError(f"seeds_for: {item!r} is not ALGO:SEED[,SEED...] (e.g. iql:1,2)")
    return out


def validate(args: OfflineBenchArgs) -> dict[str, tuple[int, ...]]:
    experts = [t for t in native_task_ids() if task_spec(t).has_expert]
    for task in args.tasks:
        if task not in experts:
            raise ValueError(f"tasks: {task!r} has no scripted expert to make datasets with; tasks: {experts}")
    for name in args.recipes:
        recipe(name)
    names = offline_algorithm_names()
    for algo in args.algos:
        if algo not in names:
            raise ValueError(f"algos: {algo!r} is not an offline algorithm; offline algorithms: {', '.join(names)}")
    for name in ("gradient_steps", "evaluations", "eval_episodes", "eval_envs", "update_threads"):
        if getattr(args, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(args, name)}")
    if not 0.0 < args.labelled_fraction <= 1.0:
        raise ValueError(f"labelled_fraction must be in (0, 1], got {args.labelled_fraction}")
    extra = _parse_seeds_for(args.seeds_for)
    for algo in extra:
        if algo not in names:
            raise ValueError(f"seeds_for: {algo!r} is not an offline algorithm; offline algorithms: {', '.join(names)}")
    return extra


def dataset_path(args: OfflineBenchArgs, task: str, recipe_name: str) -> Path:
    return Path(args.data_root) / f"{task}_{recipe_name}"


def ensure_dataset(args: OfflineBenchArgs, task: str, recipe_name: str) -> Path:
    path = dataset_path(args, task, recipe_name)
    if not (path / "meta" / "rlrobot.json").is_file():
        if path.exists() and any(path.iterdir()):
            raise FileExistsError(f"{path} exists but is not a finished dataset (no meta/rlrobot.json); remove it")
        console.print(f"writing dataset {path} (recipe {recipe_name})")
        collect_demonstrations(CollectArgs(task=task, recipe=recipe_name, out=str(path), episodes=args.episodes,
                                           num_envs=16, seed=0))
    return path


class ExpertPolicy:
    """The scripted expert as a policy for ``evaluate`` (the deterministic behaviour policy of the recipes)."""

    def __init__(self, env):
        self.env = env

    def act(self, obs, deterministic: bool = True):
        return self.env.expert_action()


def behaviour_policy_result(task: str, seed: int, episodes: int, num_envs: int) -> dict[str, Any]:
    """The scripted expert without noise on the seeds an offline run's final evaluation uses (rlrobot.runners.base)."""

    env = rlrobot.make(task, num_envs, seed=seed + 1)
    try:
        return evaluate(ExpertPolicy(env), env, episodes, seed=evaluation_seed(seed))
    finally:
        env.close()


def run_config(args: OfflineBenchArgs, task: str, algo: str, seed: int, dataset: Path, out: Path):
    import dataclasses

    cfg = preset(task, algo)
    section = dataclasses.replace(cfg.algorithm, gradient_steps=args.gradient_steps)
    iterations = math.ceil(args.gradient_steps / section.updates_per_iteration)
    if iterations < args.evaluations:  # enough iterations for the curve's points
        section.updates_per_iteration = max(1, args.gradient_steps // args.evaluations)
        iterations = math.ceil(args.gradient_steps / section.updates_per_iteration)
    expert_recipe = getattr(section, "expert_recipe", None)
    if expert_recipe:  # offline imitation: the task's expert demonstrations beside the recipe's data (written when missing)
        section.expert_dataset = str(ensure_dataset(args, task, expert_recipe))
    setattr(cfg, cfg.spec.config_field, section)
    cfg.dataset, cfg.seed, cfg.out, cfg.device = str(dataset), seed, str(out), args.device
    cfg.labelled_fraction = args.labelled_fraction
    cfg.eval_episodes, cfg.eval_envs, cfg.video, cfg.logger = args.eval_episodes, args.eval_envs, False, "none"
    cfg.eval_every = max(1, iterations // args.evaluations)
    cfg.num_envs, cfg.update_threads, cfg.checkpoint_every = 1, args.update_threads, max(iterations, 1)
    return cfg


def _done_keys(results: Path) -> set[tuple]:
    if not results.is_file():
        return set()
    rows = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    return {_key(r) for r in rows}


def _key(row: dict[str, Any]) -> tuple:
    return (row["kind"], row["task"], row.get("recipe"), row.get("algo"), row.get("seed"), row.get("gradient_steps"),
            row.get("labelled_fraction", 1.0))


def _append(results: Path, row: dict[str, Any]) -> None:
    results.parent.mkdir(parents=True, exist_ok=True)
    with results.open("a") as f:
        f.write(json.dumps(row) + "\n")


def run_offline_bench(args: OfflineBenchArgs) -> dict[str, Any]:
    extra = validate(args)
    out = Path(args.out)
    results = out / "results.jsonl"
    if not args.table_only:
        algos = args.algos or offline_algorithm_names()
        done = _done_keys(results)
        for task in args.tasks:
            seed0 = args.seeds[0]
            key = ("behaviour", task, None, "expert", seed0, None, 1.0)
            if key not in done:
                res = behaviour_policy_result(task, seed0, args.eval_episodes, args.eval_envs)
                _append(results, {"kind": "behaviour", "task": task, "recipe": None, "algo": "expert", "seed": seed0,
                                  "gradient_steps": None, "labelled_fraction": 1.0, "success": res["success_rate"],
                                  "return": res["return_mean"], "episodes": res["episodes"]})
            for recipe_name in args.recipes:
                dataset = ensure_dataset(args, task, recipe_name)
                for algo in algos:
                    for seed in (*args.seeds, *extra.get(algo, ())):
                        _run_one(args, results, done, task, recipe_name, algo, seed, dataset, out)
    table = write_table(results, out / "table.md", out / "curves.png")
    console.print(table)
    return {"results": str(results), "table": str(out / "table.md"), "curves": str(out / "curves.png")}


def _run_one(args, results: Path, done: set, task: str, recipe_name: str, algo: str, seed: int, dataset: Path,
             out: Path) -> None:
    frac = args.labelled_fraction
    key = ("run", task, recipe_name, algo, seed, args.gradient_steps, frac)
    if key in done or key in _done_keys(results):  # re-read: other benchmark processes append to the same file
        return
    tag = f"{task}_{recipe_name}_{algo}_s{seed}_g{args.gradient_steps}" + (f"_l{frac:g}" if frac < 1 else "")
    run_dir = out / "runs" / tag
    if not _claim(out / "claims" / tag):
        console.print(f"{tag}: another benchmark process is running it")
        return
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)  # an interrupted run: start it again
    cfg = run_config(args, task, algo, seed, dataset, run_dir)
    console.print(f"[bold]{tag}[/]")
    start = time.perf_counter()
    runner = make_runner(cfg)
    summary = runner.learn()
    curve = [(r["env_steps"], r["eval/success_rate"], r["eval/return_mean"])
             for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "eval/success_rate" in r]
    rates = [r["perf/gradient_steps_per_s"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
             if "perf/gradient_steps_per_s" in r]
    ev = summary["eval"]
    _append(results, {"kind": "run", "task": task, "recipe": recipe_name, "algo": algo, "seed": seed,
                      "gradient_steps": args.gradient_steps, "labelled_fraction": frac, "success": ev["success_rate"],
                      "return": ev["return_mean"], "episodes": ev["episodes"], "dataset": runner.meta["dataset"],
                      "curve": curve, "gradient_steps_per_s": float(np.median(rates)) if rates else None,
                      "wall_s": round(time.perf_counter() - start, 1), "run_dir": str(run_dir)})


def _claim(path: Path) -> bool:
    """Claim a run for this process (several ``offline-bench`` processes with the same arguments share the work): the
    claim file holds the owner's pid; a claim whose process is gone is taken over."""
    import os

    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        try:
            owner = int(path.read_text().strip() or 0)
            os.kill(owner, 0)
            return owner == os.getpid()
        except (ValueError, ProcessLookupError):
            path.unlink(missing_ok=True)  # its process died: take the run over
            return _claim(path)
        except PermissionError:
            return False
    with os.fdopen(fd, "w") as f:
        f.write(str(os.getpid()))
    return True


def _mean_std(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{np.mean(values):.2f} ± {np.std(values):.2f}"


def write_table(results: Path, table_path: Path, curves_path: Path) -> str:
    """Markdown: one row per task x recipe (x labelled fraction), one column per algorithm (success / return, mean ±
    std over seeds, n seeds), the dataset's own success / return and the deterministic behaviour policy beside them."""
    rows = [json.loads(line) for line in results.read_text().splitlines() if line.strip()] if results.is_file() else []
    runs = [r for r in rows if r["kind"] == "run"]
    behaviour = {r["task"]: r for r in rows if r["kind"] == "behaviour"}
    algos = sorted({r["algo"] for r in runs}, key=_algo_order)

    recipe_order = list(RECIPES)
    groups = sorted({(r["task"], r["recipe"], r["labelled_fraction"], r["gradient_steps"]) for r in runs},
                    key=lambda g: (g[0], recipe_order.index(g[1]) if g[1] in recipe_order else len(recipe_order), -g[2], g[3]))
    head = ["task", "dataset", "budget", "data success / return", "expert (no noise)", *algos]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for task, recipe_name, frac, steps in groups:
        group = [r for r in runs if (r["task"], r["recipe"], r["labelled_fraction"], r["gradient_steps"]) ==
                 (task, recipe_name, frac, steps)]
        data = group[0]["dataset"]
        b = behaviour.get(task)
        cells = [task, recipe_name + (f" ({frac:.0%} labelled)" if frac < 1 else ""), f"{steps:,}",
                 f"{data['success_rate']:.2f} / {data['return_mean']:.1f}",
                 f"{b['success']:.2f} / {b['return']:.1f}" if b else "-"]
        for algo in algos:
            found = [r for r in group if r["algo"] == algo]
            if not found:
                cells.append("-")
                continue
            cells.append(f"{_mean_std([r['success'] for r in found])} / {_mean_std([r['return'] for r in found])}"
                         + (f" (n={len(found)})" if len(found) > 1 else ""))
        lines.append("| " + " | ".join(cells) + " |")
    speeds = {a: np.median([r["gradient_steps_per_s"] for r in runs if r["algo"] == a and r.get("gradient_steps_per_s")])
              for a in algos if any(r["algo"] == a and r.get("gradient_steps_per_s") for r in runs)}
    text = ("Success rate / mean return of the final deterministic evaluation (mean ± std over seeds where n > 1). "
            "'data': the dataset's own episodes; 'expert (no noise)': the deterministic behaviour policy on the same "
            "evaluation seeds.\n\n" + "\n".join(lines) + "\n")
    if speeds:
        text += "\nGradient steps / s (median over iterations): " + ", ".join(f"{a} {v:,.0f}" for a, v in speeds.items()) + "\n"
    table_path.parent.mkdir(parents=True, exist_ok=True)
    table_path.write_text(text)
    if runs:
        _plot_curves(runs, groups, algos, curves_path)
    return text


def _algo_order(name: str) -> tuple[bool, int]:
    """Behaviour cloning (no rewards) first, then the registry's order."""
    names = list(ALGORITHMS.names())
    return (algorithm_spec(name).needs_rewards, names.index(name) if name in names else len(names))


def _plot_curves(runs: list[dict[str, Any]], groups: list[tuple], algos: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(4, len(groups))
    rows = math.ceil(len(groups) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.2 * rows), squeeze=False)
    colours = {algo: f"C{i}" for i, algo in enumerate(algos)}  # one colour per algorithm in every panel
    for ax, (task, recipe_name, frac, steps) in zip(axes.flat, groups, strict=False):
        for algo in algos:
            curves = [r["curve"] for r in runs if (r["task"], r["recipe"], r["labelled_fraction"], r["gradient_steps"],
                                                   r["algo"]) == (task, recipe_name, frac, steps, algo) and r["curve"]]
            if not curves:
                continue
            n = min(len(c) for c in curves)
            x = [p[0] for p in curves[0][:n]]
            y = np.array([[p[1] for p in c[:n]] for c in curves])
            ax.plot(x, y.mean(0), marker="o", color=colours[algo], label=f"{algo} (n={len(curves)})" if len(curves) > 1 else algo)
            if len(curves) > 1:
                ax.fill_between(x, y.mean(0) - y.std(0), y.mean(0) + y.std(0), color=colours[algo], alpha=0.2)
        ax.set_title(f"{task} {recipe_name}" + (f" {frac:.0%} labelled" if frac < 1 else ""), fontsize=9)
        ax.set_xlabel("gradient steps")
        ax.set_ylabel("eval success rate")
        ax.set_ylim(-0.02, 1.02)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(groups):]:
        ax.axis("off")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
