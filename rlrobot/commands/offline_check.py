"""``rlrobot offline-check RUN``: which regime an offline RL run is in (overfitting, underfitting, or neither), read
from the training-time metrics alone, without an online evaluation, and what to change. The workflow of Kumar, Singh,
Tian, Finn & Levine ("A Workflow for Offline Model-Free Robotic Reinforcement Learning", CoRL 2021), for the
algorithms that log its metrics (``OfflineAlgorithm.workflow_metrics``: those with a critic on the dataset's actions, IQL,
Cal-QL / CQL, AWAC, FQL, EDP, f-DVL):

- ``workflow/q_data``: the mean Q of the dataset's own actions on fixed probe transitions. The paper's overfitting
  signal for conservative critics: it rises, peaks, then falls as training goes on (the regulariser pushes Q down
  once the critic has memorised the data); the policy near the peak is the one to keep.
- ``workflow/td_train``: the squared TD error on fixed training transitions over the variance of their TD targets
  (1 - R^2 of the critic's fit). The paper's underfitting signal: it stays high when the critic cannot fit the data.
- ``workflow/td_holdout``: the same on held-out episodes (``--ALGO.holdout-fraction``): far above ``td_train`` and
  rising while ``td_train`` stays low when the critic memorises its training data (overfitting).

The rules (thresholds below, validated on runs made to over- and underfit: tests/commands/test_offline_check.py):

- overfitting if the held-out TD error ends ``GAP`` times above the training one and above ``HOLDOUT_FLOOR``, or, without
  a held-out set, if q_data fell by more than ``Q_DROP`` of its rise from its peak, which came before the last quarter;
- else underfitting if the training TD error ends above ``UNDERFIT``;
- else neither.

The paper's remedies: for overfitting, keep the checkpoint near the q_data peak / the held-out minimum (early
stopping), or cut capacity or add regularisation (it uses dropout or a variational information bottleneck), or add
data; for underfitting, add capacity (bigger or residual networks, LayerNorm) or train longer (or DR3's regulariser).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tyro
from rich.console import Console

from rlrobot.algorithms.offline import workflow_algorithm_names
from rlrobot.algorithms.registry import ALGORITHMS, algorithm_spec

console = Console(soft_wrap=True)

GAP = 5.0
"""overfitting: the held-out TD error ends at least this many times the training one ..."""
HOLDOUT_FLOOR = 0.02
"""... and above this (1 - R^2 on held-out transitions)"""
Q_DROP = 0.1
"""overfitting without a held-out set: q_data fell from its peak by this share of its rise from the first point"""
UNDERFIT = 0.1
"""underfitting: the training TD error ends above this share of the TD targets' variance (R^2 below 0.9). A
conservative critic keeps some TD error against its regulariser: Cal-QL on 6 so101-push episodes ended at 0.055"""
TAIL = 0.25
"""the checks read the last quarter of the run (the mean of its points: one noisy point does not decide)"""


@dataclass
class OfflineCheckArgs:
    run: tyro.conf.Positional[str]
    """an offline run's directory (its metrics.jsonl, config.json)"""
    json_out: str = ""
    """also write the diagnosis as JSON here"""


def read_series(run: str | Path) -> tuple[dict[str, list[tuple[int, float]]], dict[str, Any]]:
    """({workflow key: [(gradient step, value)]}, the run's config.json or {})."""
    run = Path(run)
    metrics = run / "metrics.jsonl"
    if not metrics.is_file():
        raise FileNotFoundError(f"run={str(run)!r} has no metrics.jsonl (not a run directory)")
    series: dict[str, list[tuple[int, float]]] = {}
    for line in metrics.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        for key, value in row.items():
            if key.startswith("workflow/"):
                series.setdefault(key.removeprefix("workflow/"), []).append((int(row.get("env_steps", 0)), float(value)))
    config = run / "config.json"
    return series, (json.loads(config.read_text()) if config.is_file() else {})


def _tail_mean(values: list[float]) -> float:
    n = max(1, round(TAIL * len(values)))
    return sum(values[-n:]) / n


def diagnose(series: dict[str, list[tuple[int, float]]], flag_prefix: str = "--ALGO",
             layer_norm_flags: tuple[str, ...] = ()) -> dict[str, Any]:
    """The regime of a run from its workflow series (see the module docstring), with the evidence and what to change
    (``flag_prefix``: the algorithm's flags, ``layer_norm_flags``: its switches for LayerNorm in the critics)."""
    if "q_data" not in series or "td_train" not in series or len(series["td_train"]) < 3:
        raise ValueError("the run logs no workflow metrics over at least 3 iterations (workflow/q_data, workflow/td_train): "
                         "only the offline algorithms with a critic on the dataset's actions log them "
                         f"({', '.join(workflow_algorithm_names())})")
    steps = [s for s, _ in series["td_train"]]
    q = [v for _, v in series["q_data"]]
    td_train = [v for _, v in series["td_train"]]
    td_holdout = [v for _, v in series.get("td_holdout", [])]
    evidence: dict[str, Any] = {"steps": steps[-1], "q_data": q[-1], "td_train": _tail_mean(td_train)}
    peak = max(range(len(q)), key=q.__getitem__)
    rise = q[peak] - q[0]
    q_drop = (q[peak] - _tail_mean(q)) / rise if rise > 0 else 0.0
    evidence.update(q_peak_step=steps[peak], q_drop=q_drop)
    overfit = False
    if td_holdout:
        best = min(range(len(td_holdout)), key=td_holdout.__getitem__)
        held, train = _tail_mean(td_holdout), evidence["td_train"]
        evidence.update(td_holdout=held, td_holdout_min=td_holdout[best], td_holdout_min_step=steps[best],
                        gap=held / max(train, 1e-12))
        overfit = held > HOLDOUT_FLOOR and held > GAP * train
    else:
        overfit = q_drop > Q_DROP and peak < (1 - TAIL) * len(q)
    if overfit:
        keep = evidence["td_holdout_min_step"] if td_holdout else steps[peak]
        regime = "overfitting"
        why = (f"held-out TD error {evidence['td_holdout']:.3g} is {evidence['gap']:.0f}x the training one "
               f"({evidence['td_train']:.2g}); its minimum {evidence['td_holdout_min']:.3g} was at step {keep:,}"
               if td_holdout else
               f"the dataset actions' mean Q peaked at step {keep:,} and has fallen by {q_drop:.0%} of its rise since")
        early = f"keep the policy near step {keep:,} (early stopping: {flag_prefix}.gradient-steps {keep})"
        advice = [early] if keep < steps[-1] else []
        advice += [f"reduce the critic's capacity ({flag_prefix}.hidden smaller) or add regularisation (the paper: dropout "
                   "or an information bottleneck)",
                   "add data (more episodes)"]
    elif evidence["td_train"] > UNDERFIT:
        regime = "underfitting"
        why = (f"the training TD error stays at {evidence['td_train']:.3g} of the TD targets' variance (over {UNDERFIT}): "
               "the critic cannot fit the data")
        advice = [f"more capacity ({flag_prefix}.hidden 256 256, or deeper)"]
        advice += [f"LayerNorm in the critics ({' '.join(layer_norm_flags)})"] if layer_norm_flags else []
        advice += [f"more gradient steps ({flag_prefix}.gradient-steps)"]
    else:
        regime = "neither"
        why = (f"the training TD error is {evidence['td_train']:.2g}"
               + (f" and the held-out one {evidence['td_holdout']:.2g}" if td_holdout else "")
               + ": the critic fits its data and generalises")
        advice = ["no change the workflow asks for; more steps may still help while q_data rises"]
        if not td_holdout:
            advice.append(f"a held-out set ({flag_prefix}.holdout-fraction 0.1) gives the overfitting check more to go on")
    return {"regime": regime, "why": why, "advice": advice, "evidence": evidence}


def layer_norm_switches(algo: str) -> tuple[str, ...]:
    """The CLI switches that put LayerNorm in an algorithm's critics (its config's boolean ``*critic_layer_norm`` fields)."""
    if algo not in ALGORITHMS.names():
        return ()
    spec = algorithm_spec(algo)
    return tuple(f"--{spec.config_field.replace('_', '-')}.{f.name.replace('_', '-')}" for f in dataclasses.fields(spec.config)
                 if f.name.endswith("critic_layer_norm"))


def run_offline_check(args: OfflineCheckArgs) -> dict[str, Any]:
    series, config = read_series(args.run)
    algo = config.get("train", {}).get("algo", "ALGO")
    try:
        verdict = diagnose(series, f"--{algo}", layer_norm_switches(algo))
    except ValueError as e:
        raise ValueError(f"run={str(args.run)!r} (algo={algo!r}): {e}") from None
    result = {"run": str(args.run), "algo": algo, **verdict}
    console.print(f"[bold]{args.run}[/] ({algo}): [bold]{result['regime']}[/]")
    console.print(f"  {result['why']}")
    for line in result["advice"]:
        console.print(f"  - {line}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=1) + "\n")
    return result
