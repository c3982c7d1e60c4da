"""``rlrobot train``: the run config from a preset (``--task`` / ``--algo``) and the flags, ``--resume``, and the
summary printed at the end (tyro turns the config dataclasses into flags; ``rlrobot train --algo X --help`` shows
the common options of algorithm X, ``--help-all`` every one)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import tyro
from rich.console import Console

from rlrobot.algorithms.registry import algorithm_spec
from rlrobot.checkpoints import load_config, newest_intact_checkpoint
from rlrobot.commands.train_help import short_help
from rlrobot.config import config_class, config_from_checkpoint
from rlrobot.configs import preset
from rlrobot.rewards.registry import NONE as NO_SHAPING
from rlrobot.runners.base import make_runner

console = Console(soft_wrap=True)


def _preset_from_argv(argv: list[str]):
    """Pick the preset from --task / --algo first, so that every other flag overrides that preset's defaults."""

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--task", default="so101-reach")
    pre.add_argument("--algo", default="ppo")
    known, _ = pre.parse_known_args(argv)
    algorithm_spec(known.algo)  # an unknown algorithm is refused with the registered names, before tyro
    return preset(known.task, known.algo)


def parse_train_args(argv: list[str]):
    """The run config of a ``rlrobot train`` command line (preset of --task / --algo, then every flag), unvalidated."""

    argv = _normalise_numbers(argv)
    default = _preset_from_argv(argv)
    spec = algorithm_spec(default.algo)
    return tyro.cli(config_class(default.algo), default=default, args=argv, prog=f"rlrobot train --algo {spec.name}",
                    description=f"Train with {spec.name}: {spec.summary}. Presets in rlrobot.configs set the defaults "
                                "for each --task / --algo pair; other algorithms: rlrobot list-algos.")


def train(argv: list[str]) -> dict:
    argv = _normalise_numbers(argv)
    if "--help-all" in argv:  # tyro's full help: every flag, its type and default
        parse_train_args(["--help" if a == "--help-all" else a for a in argv])
    if "--help" in argv or "-h" in argv:
        print(short_help(_preset_from_argv(argv)))
        raise SystemExit(0)
    if _given(argv, "resume"):
        argv = _with_run_identity(argv)
    cfg = parse_train_args(argv)
    if _given(argv, "total_steps") and cfg.steps_per_iteration() == 0:
        raise ValueError(f"--total-steps does not apply to algo={cfg.algo!r}, which does not step the env; "
                         f"its budget is {cfg.spec.budget_flag()}")
    if cfg.resume:
        cfg = _resume_config(cfg, argv)
    summary = make_runner(cfg).learn()  # the runner prepares the config (reads --init / --dataset) once, first
    if summary.get("interrupted"):
        console.print(f"[yellow]interrupted[/] at iteration {summary['iteration']:,} ({summary['log_step']:,} "
                      f"{summary['x_label']}); checkpoint {summary['checkpoint']}", soft_wrap=True)
        console.print(f"  resume with:    {summary['resume_command']}", soft_wrap=True)
        return summary
    if "eval" not in summary:  # a rank other than 0 of a distributed run: rank 0 reports
        return summary
    ev = summary["eval"]
    if "success_rate" in ev or not ev:
        returns = "task return" if cfg.reward.shaping != NO_SHAPING else "return"
        result = (f"eval success {ev.get('success_rate', 0):.3f}, {returns} {ev.get('return_mean', 0):.2f} "
                  f"over {ev.get('episodes', 0)} episodes")
    else:  # a model rather than a policy (--algo prm): its own held-out metrics
        result = "eval " + ", ".join(f"{k} {v:.3f}" for k, v in ev.items() if isinstance(v, float))
    console.print(f"[bold green]done[/] {summary['log_step']:,} {summary['x_label']} in {summary['train_wall_time_s']:.0f} s; "
                  f"{result}", soft_wrap=True)
    console.print(f"  run dir:        {summary['run_dir']}", soft_wrap=True)
    console.print(f"  checkpoint:     {summary['checkpoint']}", soft_wrap=True)
    console.print(f"  learning curve: {summary['learning_curve']}", soft_wrap=True)
    if "video" in ev:
        console.print(f"  eval video:     {ev['video']}", soft_wrap=True)
    console.print(f"  eval results:   {summary['run_dir']}/eval.json", soft_wrap=True)
    return summary


_SCIENTIFIC = re.compile(r"^[0-9]+(\.[0-9]+)?[eE]\+?[0-9]+$")


def _normalise_numbers(argv: list[str]) -> list[str]:
    """``--total-steps 1e5`` -> ``100000``: scientific notation for whole numbers, which int flags do not parse."""
    out = []
    for i, token in enumerate(argv):
        if i > 0 and argv[i - 1].startswith("--") and _SCIENTIFIC.match(token) and float(token).is_integer():
            token = str(int(float(token)))
        out.append(token)
    return out


def _given(argv: list[str], name: str) -> bool:
    return name in _given_fields(argv)


def _given_fields(argv: list[str]) -> set[str]:
    """Dotted field names of the flags on the command line (``--ppo.lr`` -> ``ppo.lr``, ``--no-video`` -> ``video``)."""
    names = set()
    for token in argv:
        if token.startswith("--"):
            name = token[2:].split("=", 1)[0]
            if name.startswith("no-"):
                name = name[3:]
            names.add(name.replace("-", "_"))
    return names


# what may change when a run is resumed: its length, logging, evaluation, checkpointing and thread counts
RESUMABLE = {"resume", "out", "total_steps", "logger", "wandb_project", "wandb_mode", "checkpoint_every", "eval_every",
             "eval_episodes", "eval_envs", "video", "video_episodes", "num_threads", "torch_threads", "update_threads"}


def _with_run_identity(argv: list[str]) -> list[str]:
    """``--resume``: the --algo and --task of the run in --out unless given, so that the run's own flags parse
    (``--bc.gradient-steps`` needs --algo bc) without repeating them."""

    out = _flag_value(argv, "--out")
    ckpt_dir = Path(out) / "checkpoints" if out else None
    if ckpt_dir is None or not ckpt_dir.is_dir():
        return argv  # _resume_config says what is missing
    saved = load_config(newest_intact_checkpoint(ckpt_dir, report=lambda m: None))["train"]
    identity = [token for name in ("algo", "task") if not _given(argv, name) for token in (f"--{name}", saved[name])]
    return identity + argv


def _flag_value(argv: list[str], flag: str) -> str | None:
    for i, token in enumerate(argv):
        if token == flag and i + 1 < len(argv):
            return argv[i + 1]
        if token.startswith(flag + "="):
            return token.split("=", 1)[1]
    return None


def _resume_config(cfg, argv: list[str]):
    """Resume the run in --out (the directory given is the run) with its own config. Flags that may change on a
    resume (RESUMABLE) are honoured; any other flag that differs from the run's value is refused, naming it."""

    run_dir = cfg.run_dir()
    ckpt_dir = Path(run_dir) / "checkpoints"
    if not ckpt_dir.is_dir():
        raise FileNotFoundError(f"--resume: {run_dir} holds no checkpoints/ (is --out the run directory?)")
    resumed = config_from_checkpoint(load_config(newest_intact_checkpoint(ckpt_dir, report=lambda m: None)))
    budget = resumed.spec.config.budget_field
    # an algorithm that does not step the env has its own budget flag instead of --total-steps
    resumable = RESUMABLE - {"total_steps"} | {f"{resumed.spec.config_field}.{budget}"} if budget else RESUMABLE
    refused = []
    for name in sorted(_given_fields(argv) - {"task", "algo"}):
        given, saved = _get_field(cfg, name), _get_field(resumed, name)
        if name in resumable:
            _set_field(resumed, name, given)
        elif given is not _MISSING and given != saved:
            refused.append(f"--{name.replace('_', '-')} (run: {saved!r}, given: {given!r})")
    for name in ("task", "algo"):
        if _given(argv, name) and getattr(cfg, name) != getattr(resumed, name):
            refused.append(f"--{name} (run: {getattr(resumed, name)!r}, given: {getattr(cfg, name)!r})")
    if refused:
        raise ValueError(f"cannot change on --resume: {', '.join(refused)}; what may change: "
                         f"{', '.join('--' + n.replace('_', '-') for n in sorted(resumable - {'resume', 'out'}))}")
    resumed.resume = True
    resumed.out = run_dir  # wherever the run directory was copied or moved to
    return resumed


_MISSING = object()


def _get_field(obj, dotted: str):
    for part in dotted.split("."):
        obj = getattr(obj, part, _MISSING)
        if obj is _MISSING:
            return _MISSING
    return obj


def _set_field(obj, dotted: str, value) -> None:
    *parents, last = dotted.split(".")
    for part in parents:
        obj = getattr(obj, part)
    setattr(obj, last, value)


def main(argv: list[str]) -> dict:
    """``rlrobot train ARGS``: an interrupted run exits 130 (128 + SIGINT) so scripts do not take it for a finished one."""
    summary = train(argv)
    if summary.get("interrupted"):
        raise SystemExit(130)
    return summary
