"""Run a registry entry over seeds and write ``results/<name>.json``.

Each step is one ``rlrobot`` command line run in its own process (``python -m rlrobot ...``), so a result is what
that command line gives a user, with its log in ``<seed dir>/<step>.log`` and a record in ``<step>.step.json`` (the
exact command, return code, wall time, git commit and uncommitted paths). A step whose record says it finished with
the same command line is reused, so an interrupted ``rlrobot results run`` continues where it stopped and a later
``--seeds 5`` runs only the new seeds.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rlrobot.data.demonstrations import RLROBOT_META
from rlrobot.results.registry import Entry, Step

RUNS_ROOT = Path("runs/results")
RESULTS_DIR = Path("results")
CURVE_POINTS = 200  # a curve longer than this is thinned for the JSON file


# ---------------------------------------------------------------------- command lines
def step_output(step: Step, seed_dir: Path) -> Path:
    return seed_dir / (f"{step.name}.json" if step.output_is_file else step.name)


def step_argv(entry: Entry, step: Step, seed: int, seed_dir: Path) -> list[str]:
    """The step's command line for this seed: {seed}, {out} and {<earlier step>} filled in."""
    values = {"seed": str(seed), "out": str(step_output(step, seed_dir))}
    for earlier in entry.steps:
        if earlier is step:
            break
        values[earlier.name] = str(step_output(earlier, seed_dir))
    out = []
    for token in step.argv:
        try:
            out.append(token.format(**values))
        except KeyError as e:
            raise ValueError(f"entry {entry.name!r}, step {step.name!r}: placeholder {e} names no earlier step "
                             f"(known: {sorted(values)})") from e
    return out


def command_template(entry: Entry, step: Step, root: Path = RUNS_ROOT) -> str:
    """The step as a shell line for any seed ``$S`` (what the README shows)."""
    argv = step_argv(entry, step, 0, root / entry.name / "s0")
    seeded = [_seeded(token, root / entry.name) for token in argv]
    seed_at = [i for i, t in enumerate(step.argv) if t == "{seed}"]
    for i in seed_at:
        seeded[i] = "$S"
    return "rlrobot " + " ".join(t if t.startswith("$") or "$S" in t else shlex.quote(t) for t in seeded)


def _seeded(token: str, entry_root: Path) -> str:
    prefix = str(entry_root / "s0")
    return token.replace(prefix, str(entry_root) + "/s$S") if token.startswith(prefix) else token


# ---------------------------------------------------------------------- provenance
def git_state(cwd: Path | None = None) -> dict[str, Any]:
    """Commit and uncommitted tracked paths of the working tree (the code a step ran)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False).stdout

    commit = git("rev-parse", "HEAD").strip()
    # porcelain lines are "XY path": no strip of the whole output, whose first line may start with a blank X
    dirty = [line[3:] for line in git("status", "--porcelain", "--untracked-files=no").splitlines() if line.strip()]
    return {"git_commit": commit or "unknown", "git_dirty": bool(dirty), "dirty_paths": dirty}


def machine_description(note: str = "") -> dict[str, Any]:
    import mujoco
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return {"cpu": cpu, "cores": os.cpu_count(), "gpu": gpu, "platform": platform.platform(),
            "python": platform.python_version(), "torch": torch.__version__, "mujoco": mujoco.__version__,
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()], "note": note}


# ---------------------------------------------------------------------- running
def _finished(step: Step, out: Path) -> bool:
    if step.kind == "train":
        return (out / "summary.json").is_file() and "eval" in json.loads((out / "summary.json").read_text())
    if step.kind == "collect":
        return (out / RLROBOT_META).is_file()
    if step.kind == "eval":
        return (out / "eval.json").is_file()
    return out.is_file()


def run_step(argv: list[str], step: Step, out: Path, seed_dir: Path, force: bool = False,
             nice: int = 0) -> dict[str, Any]:
    """Run one step (or reuse it when its record shows the same command finished); returns its record."""
    record_path = seed_dir / f"{step.name}.step.json"
    if not force and record_path.is_file() and _finished(step, out):
        record = json.loads(record_path.read_text())
        if record.get("argv") == argv and record.get("returncode") == 0:
            record["reused"] = True
            return record
    if force and out.exists():  # --force: this step's earlier output goes, so the step runs from scratch
        shutil.rmtree(out) if out.is_dir() else out.unlink()
    if out.exists() and not step.output_is_file and any(out.iterdir()):
        raise FileExistsError(f"{out} holds an unfinished or different run of step {step.name!r}: remove it to re-run")
    seed_dir.mkdir(parents=True, exist_ok=True)
    record = {"argv": argv, "command": "rlrobot " + shlex.join(argv), **git_state(),
              "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    cmd = [sys.executable, "-m", "rlrobot", *argv]
    if nice:
        cmd = ["nice", "-n", str(nice), *cmd]
    log = seed_dir / f"{step.name}.log"
    start = time.perf_counter()
    with log.open("w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, check=False).returncode
    record.update(returncode=rc, wall_s=round(time.perf_counter() - start, 1))
    record_path.write_text(json.dumps(record, indent=2))
    if rc != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-5:])
        raise RuntimeError(f"step {step.name!r} failed (exit {rc}): {record['command']}\nlog {log}:\n{tail}")
    return record


# ---------------------------------------------------------------------- figures
def _flatten(value: Any, prefix: str, out: dict[str, float]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(v, f"{prefix}.{k}", out)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _flatten(v, f"{prefix}.{i}", out)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        out[prefix] = float(value)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def step_figures(step: Step, out: Path) -> dict[str, float]:
    """What a step measured, as ``<step>.<metric>``. train: success, return (final evaluation), env_steps,
    updates (the run's x axis), wall_s (training), peak_success (best evaluation during training, the final one
    included, the start's left out), start_success (a fine-tuned run's evaluation before training), train_success
    (last logged training success); collect: expert_success, attempted; eval: every number of ``rlrobot eval``'s
    eval.json (success_rate, steps_to_success_mean, chunk_utilisation, ...); experts / bench: every number of their
    JSON output, flattened (``experts.so101-push.success``, ``bench.ppo.0.raw_steps_per_s``)."""
    figures: dict[str, float] = {}
    if step.kind == "train":
        summary = json.loads((out / "summary.json").read_text())
        ev = summary["eval"]
        figures.update(success=ev["success_rate"], **{"return": ev["return_mean"]}, env_steps=summary["env_steps"],
                       updates=summary["log_step"], wall_s=summary["train_wall_time_s"])
        rows = read_metrics(out / "metrics.jsonl")
        # during training: the evaluation of a fine-tuned run's start (at step 0) is not a training result
        evals = [r["eval/success_rate"] for r in rows if "eval/success_rate" in r and r["env_steps"] > 0]
        figures["peak_success"] = max([*evals, ev["success_rate"]])
        start = [r["eval/success_rate"] for r in rows if "eval/success_rate" in r and r["env_steps"] == 0]
        if start:
            figures["start_success"] = start[0]
        train_success = [r["train/success"] for r in rows if "train/success" in r]
        if train_success:
            figures["train_success"] = train_success[-1]
    elif step.kind == "collect":
        meta = json.loads((out / RLROBOT_META).read_text())
        figures.update(expert_success=meta["expert_success_rate"], attempted=meta["episodes_attempted"])
    else:
        _flatten(json.loads((out / "eval.json" if step.kind == "eval" else out).read_text()), "", figures)
        figures = {k.lstrip("."): v for k, v in figures.items()}
    return {f"{step.name}.{k}": float(v) for k, v in figures.items()}


def step_curve(step: Step, out: Path, metric: str) -> dict[str, list[float]]:
    rows = [r for r in read_metrics(out / "metrics.jsonl") if metric in r]
    stride = max(1, math.ceil(len(rows) / CURVE_POINTS))
    rows = rows[::stride] if rows and (len(rows) - 1) % stride == 0 else rows[::stride] + rows[-1:]
    return {"x": [float(r["env_steps"]) for r in rows], "y": [float(r[metric]) for r in rows]}


def aggregate(values: list[float]) -> dict[str, Any]:
    """mean and sample standard deviation (n - 1; 0 for one seed) over seeds."""
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return {"mean": mean, "std": std, "n": n, "values": values}


# ---------------------------------------------------------------------- one entry
def run_entry(entry: Entry, seeds: list[int] | None = None, root: Path = RUNS_ROOT, results_dir: Path = RESULTS_DIR,
              force: bool = False, nice: int = 0, machine_note: str = "", log=print) -> dict[str, Any]:
    """Run (or reuse) every step of ``entry`` for each seed, then write ``results_dir/<name>.json``."""
    seeds = list(range(entry.seeds)) if seeds is None else seeds
    if not seeds:
        raise ValueError("seeds must name at least one seed")
    machine = machine_description(machine_note)
    per_seed = []
    for seed in seeds:
        seed_dir = root / entry.name / f"s{seed}"
        records, figures = [], {}
        for step in entry.steps:
            argv = step_argv(entry, step, seed, seed_dir)
            out = step_output(step, seed_dir)
            log(f"[{entry.name} seed {seed}] {step.name}: rlrobot {shlex.join(argv)}")
            record = run_step(argv, step, out, seed_dir, force=force, nice=nice)
            log(f"[{entry.name} seed {seed}] {step.name}: {'reused' if record.get('reused') else 'done'} "
                f"({record['wall_s']:.0f} s)")
            records.append({k: v for k, v in record.items() if k != "reused"})
            figures.update(step_figures(step, out))
        curve = {}
        if entry.curve:
            step_name, metric = entry.curve.split(".", 1)
            step = next(s for s in entry.steps if s.name == step_name)
            curve = step_curve(step, step_output(step, seed_dir), metric)
        per_seed.append({"seed": seed, "figures": figures, "steps": records, "curve": curve,
                         "wall_s": round(sum(r["wall_s"] for r in records), 1)})
    result = entry_result(entry, per_seed, machine, root)
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / f"{entry.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def entry_result(entry: Entry, per_seed: list[dict[str, Any]], machine: dict[str, Any], root: Path) -> dict[str, Any]:
    missing = [(f.key, p["seed"]) for f in entry.figures for p in per_seed if f.key not in p["figures"]]
    if missing:
        raise ValueError(f"entry {entry.name!r}: figures not measured by its steps: {missing}")
    commits = sorted({r["git_commit"] for p in per_seed for r in p["steps"]})
    return {
        "name": entry.name, "title": entry.title, "task": entry.task, "group": entry.group, "budget": entry.budget,
        "target": entry.target, "notes": entry.notes,
        "figures": [{"key": f.key, "label": f.label, "fmt": f.fmt, "per_seed": f.per_seed} for f in entry.figures],
        "summary": {f.key: aggregate([p["figures"][f.key] for p in per_seed]) for f in entry.figures},
        "seeds": [p["seed"] for p in per_seed],
        "commands": [command_template(entry, s, root) for s in entry.steps],
        "reproduce": f"rlrobot results run --only {entry.name} --seeds {len(per_seed)}",
        "code": {"commits": commits, "dirty": any(r["git_dirty"] for p in per_seed for r in p["steps"])},
        "wall_s_per_seed": aggregate([p["wall_s"] for p in per_seed]),
        "machine": machine,
        "written": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "per_seed": per_seed,
    }
