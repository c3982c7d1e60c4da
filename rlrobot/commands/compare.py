"""``rlrobot compare RUN [RUN ...]``: several runs' evaluation curves on one PNG, against env steps and training wall
clock, and a table of final / best values and the steps and seconds each took to reach ``--level``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from rlrobot.logging.compare import comparison_table, parse_mark, run_curve, write_comparison


@dataclass
class CompareArgs:
    runs: tuple[str, ...]
    """run directories (each with a metrics.jsonl)"""
    labels: tuple[str, ...] = ()
    """one label per run (default: the directory names)"""
    metric: str = "eval/success_rate"
    """the metric to compare (a key of metrics.jsonl)"""
    level: float = 0.9
    """report the env steps and wall clock at which each run first reached this value"""
    start: tuple[float, ...] = ()
    """optional value at step 0 per run (e.g. the --init checkpoint's success), drawn as the first point"""
    out: str = "comparison.png"
    """the PNG to write"""
    title: str = ""
    """figure title"""
    json_out: str = ""
    """also write the table as JSON here"""
    mark: tuple[str, ...] = ()
    """vertical lines on the env-steps axis, STEP:LABEL each (e.g. --mark 5000:online); a run whose config.json has a
    warm-start switch point (warm_start.switch_step) gets its own dashed line in its colour without this"""


def run_compare(args: CompareArgs) -> list[dict[str, Any]]:
    import json

    if not args.runs:
        raise ValueError("runs: give at least one run directory")
    if args.labels and len(args.labels) != len(args.runs):
        raise ValueError(f"labels: {len(args.labels)} labels for {len(args.runs)} runs; give one per run or none")
    if args.start and len(args.start) != len(args.runs):
        raise ValueError(f"start: {len(args.start)} values for {len(args.runs)} runs; give one per run or none")
    marks = tuple(parse_mark(m) for m in args.mark)  # refused before any run is read
    labels = args.labels or tuple(Path(r).name for r in args.runs)
    starts = args.start or (None,) * len(args.runs)
    curves = [run_curve(r, label, args.metric, s) for r, label, s in zip(args.runs, labels, starts, strict=True)]
    table = comparison_table(curves, args.level)
    png = write_comparison(curves, args.out, args.metric, args.title, args.level, marks)
    view = Table(title=f"{args.metric} (level {args.level:g})")
    for column in table[0]:
        view.add_column(column, justify="left" if column == "run" else "right")
    for row in table:
        view.add_row(*(v if isinstance(v, str) else "-" if v is None else f"{v:,.3f}" if abs(v) < 10 else f"{v:,.0f}"
                       for v in row.values()))
    console = Console()
    console.print(view)
    console.print(f"figure: {png}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(table, indent=2))
    return table
