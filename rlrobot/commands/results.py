"""``rlrobot results``: reproduce the README's results from the registry (``rlrobot.results.registry``).

    rlrobot results run [--only NAME ...] [--seeds N] [--dry-run]   run entries, write results/<name>.json, README, PNGs
    rlrobot results table                                          README table + PNGs from results/*.json, no runs
    rlrobot results list                                           registered entries, which have results
    rlrobot results experts --tasks so101-push --episodes 256      scripted-expert success / cube-lost rates
    rlrobot results deploy-twin --checkpoint DIR                   serve + deploy on the twin over loopback, one step
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import tyro
from rich.console import Console

from rlrobot.logging.tables import print_table
from rlrobot.results.experts import ExpertsArgs, run_experts
from rlrobot.results.registry import ENTRIES, entry
from rlrobot.results.report import write_report
from rlrobot.results.runner import command_template, run_entry, step_argv
from rlrobot.results.twin import TwinDeployArgs, deploy_twin

console = Console(soft_wrap=True)
SUBCOMMANDS = {
    "run": "run registry entries over seeds; write results/<name>.json, the README table and the PNGs",
    "table": "regenerate the README table and the PNGs from results/*.json without running anything",
    "list": "the registered entries, their budgets and which have results",
    "experts": "scripted-expert success and cube-lost rates (a registry step)",
    "deploy-twin": "serve a checkpoint over loopback and deploy it on the twin (a registry step)",
}
USAGE = "usage: rlrobot results <subcommand> [options]\n\nsubcommands:\n" + "".join(
    f"  {name:<12} {what}\n" for name, what in SUBCOMMANDS.items())


@dataclass
class RunArgs:
    only: tuple[str, ...] = ()
    """entry names to run (default: every registered entry)"""
    seeds: int | None = None
    """run seeds 0..N-1 (default: each entry's own count; 3 for the headline rows)"""
    dry_run: bool = False
    """print the command lines of every step and seed, run nothing"""
    force: bool = False
    """re-run steps that already finished with the same command (default: reuse them)"""
    nice: int = 0
    """run the steps under nice -n NICE (a shared machine)"""
    machine_note: str = ""
    """recorded with the results, e.g. 'cores shared with other jobs'"""
    results_dir: str = "results"
    runs_dir: str = "runs/results"
    """where the steps' run directories go (seed dirs: <runs_dir>/<name>/s<seed>)"""
    readme: str = "README.md"
    """regenerated after the runs ('' = leave it)"""


@dataclass
class TableArgs:
    results_dir: str = "results"
    readme: str = "README.md"


def run(args: RunArgs) -> list[dict]:
    entries = [entry(name) for name in args.only] if args.only else list(ENTRIES)  # unknown names refused first
    if args.seeds is not None and args.seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {args.seeds}")
    root = Path(args.runs_dir)
    if args.dry_run:
        for e in entries:
            seeds = range(args.seeds if args.seeds is not None else e.seeds)
            console.print(f"[bold]{e.name}[/]: {e.title}; {e.budget}; seeds {list(seeds)}; {e.cost}")
            for seed in seeds:
                for step in e.steps:
                    print(f"  rlrobot {' '.join(step_argv(e, step, seed, root / e.name / f's{seed}'))}")
            print("  as a template: " + " + ".join(command_template(e, s, root) for s in e.steps))
        return []
    written = []
    for e in entries:
        seeds = list(range(args.seeds if args.seeds is not None else e.seeds))
        result = run_entry(e, seeds, root=root, results_dir=Path(args.results_dir), force=args.force, nice=args.nice,
                           machine_note=args.machine_note, log=lambda m: console.print(m, highlight=False))
        first = result["figures"][0]
        s = result["summary"][first["key"]]
        console.print(f"[bold green]{e.name}[/]: {first['label']} {s['mean']:.3f} +- {s['std']:.3f} over seeds "
                      f"{result['seeds']}; wrote {args.results_dir}/{e.name}.json")
        written.append(result)
    if args.readme:
        table(TableArgs(results_dir=args.results_dir, readme=args.readme))
    return written


def table(args: TableArgs) -> None:
    readme, pngs = write_report(Path(args.results_dir), Path(args.readme))
    console.print(f"wrote the results table of {readme} and {', '.join(map(str, pngs)) or 'no curves'}")


def list_entries(results_dir: str = "results") -> None:
    rows = []
    for e in ENTRIES:
        path = Path(results_dir) / f"{e.name}.json"
        rows.append((e.name, e.group, str(e.seeds), e.budget, e.cost,
                     json.loads(path.read_text())["written"] if path.is_file() else "not run"))
    print_table(console, "rlrobot results entries (rlrobot results run --only NAME)",
                ("name", "group", "seeds", "budget", "cost", "result file"), rows)


def main(argv: list[str]) -> None:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return
    sub, rest = argv[0], argv[1:]
    if sub not in SUBCOMMANDS:
        raise ValueError(f"unknown results subcommand {sub!r}; valid: {', '.join(SUBCOMMANDS)}")
    if sub == "run":
        run(tyro.cli(RunArgs, args=rest, prog="rlrobot results run"))
    elif sub == "table":
        table(tyro.cli(TableArgs, args=rest, prog="rlrobot results table"))
    elif sub == "list":
        list_entries(tyro.cli(TableArgs, args=rest, prog="rlrobot results list").results_dir)
    elif sub == "experts":
        run_experts(tyro.cli(ExpertsArgs, args=rest, prog="rlrobot results experts"))
    elif sub == "deploy-twin":
        deploy_twin(tyro.cli(TwinDeployArgs, args=rest, prog="rlrobot results deploy-twin"))
