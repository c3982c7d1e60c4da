"""``rlrobot`` command line: train, eval, collect, list-tasks, list-algos, bench, serve, deploy (tyro turns the
config dataclasses into flags; ``rlrobot train --algo X --help`` shows the options of algorithm X)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import tyro
from rich.console import Console
from rich.table import Table

console = Console()
COMMANDS = ("train", "eval", "collect", "list-tasks", "list-algos", "bench", "serve", "deploy")


def _preset_from_argv(argv: list[str]):
    """Pick the preset from --task / --algo first, so that every other flag overrides that preset's defaults."""
    from rlrobot.algorithms.registry import algorithm_spec
    from rlrobot.configs import preset

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--task", default="so101-reach")
    pre.add_argument("--algo", default="ppo")
    known, _ = pre.parse_known_args(argv)
    algorithm_spec(known.algo)  # an unknown algorithm is refused with the registered names, before tyro
    return preset(known.task, known.algo)


def train(argv: list[str]) -> dict:
    from rlrobot.algorithms.registry import algorithm_spec
    from rlrobot.config import config_class

    default = _preset_from_argv(argv)
    spec = algorithm_spec(default.algo)
    cfg = tyro.cli(config_class(default.algo), default=default, args=argv, prog=f"rlrobot train --algo {spec.name}",
                   description=f"Train with {spec.name}: {spec.summary}. Presets in rlrobot.configs set the defaults "
                               "for each --task / --algo pair; other algorithms: rlrobot list-algos.")
    if cfg.resume:
        cfg = _resume_config(cfg, argv)
    cfg.prepare()
    from rlrobot.runners.base import make_runner

    summary = make_runner(cfg).learn()
    if "eval" not in summary:  # a rank other than 0 of a distributed run: rank 0 reports
        return summary
    ev = summary["eval"]
    console.print(f"[bold green]done[/] {summary['env_steps']:,} env steps in {summary['train_wall_time_s']:.0f} s; "
                  f"eval success {ev.get('success_rate', 0):.3f}, return {ev.get('return_mean', 0):.2f} "
                  f"over {ev.get('episodes', 0)} episodes")
    console.print(f"  run dir:        {summary['run_dir']}")
    console.print(f"  checkpoint:     {summary['checkpoint']}")
    console.print(f"  learning curve: {summary['learning_curve']}")
    if "video" in ev:
        console.print(f"  eval video:     {ev['video']}")
    console.print(f"  eval results:   {summary['run_dir']}/eval.json")
    return summary


def _resume_config(cfg, argv: list[str]):
    """Resume with the run's own config; only --total-steps (to extend a run) is taken from the command line."""
    from rlrobot.config import config_from_checkpoint
    from rlrobot.runners.checkpoint import load_checkpoint

    run_dir = cfg.run_dir()
    _, saved, _ = load_checkpoint(Path(run_dir) / "checkpoints")
    resumed = config_from_checkpoint(saved)
    resumed.resume = True
    resumed.out = run_dir  # the directory given is the run, wherever it was copied or moved to
    if any(a == "--total-steps" or a.startswith("--total-steps=") for a in argv):
        resumed.total_steps = cfg.total_steps
    return resumed


@dataclass
class EvalArgs:
    checkpoint: str
    """a checkpoint directory or a run directory (its latest checkpoint is used)"""
    episodes: int = 64
    num_envs: int = 32
    task: str | None = None
    """evaluate on another task than the one trained on (its spaces must match)"""
    seed: int = 12345
    video: bool = True
    out: str | None = None
    """where to write eval.json and the video (default: the checkpoint directory)"""
    device: str = "cpu"


def evaluate_checkpoint(args: EvalArgs) -> dict:
    import torch

    import rlrobot
    from rlrobot.config import config_from_checkpoint
    from rlrobot.policies.registry import build_policy, check_compatible, policy_metadata
    from rlrobot.runners.checkpoint import load_checkpoint
    from rlrobot.runners.evaluation import evaluate

    if args.episodes < 1 or args.num_envs < 1:
        raise ValueError("episodes and num_envs must be >= 1")
    weights, saved, ckpt = load_checkpoint(args.checkpoint)
    cfg = config_from_checkpoint(saved)
    if args.task is not None:
        from rlrobot.envs.registry import validate_task_id

        validate_task_id(args.task)
        cfg.task = args.task
    env = rlrobot.make(cfg.task, args.num_envs, backend=cfg.backend if args.task is None else None,
                       device=args.device, seed=args.seed, **cfg.task_options())
    try:
        check_compatible(saved, policy_metadata(cfg, env))
        policy = build_policy(saved, cfg)
        policy.load_state_dict(weights)
        policy.to(torch.device(args.device)).eval()
        out = Path(args.out) if args.out else ckpt
        out.mkdir(parents=True, exist_ok=True)
        result = evaluate(policy, env, args.episodes, seed=args.seed,
                          video_path=out / "eval.mp4" if args.video else None)
    finally:
        env.close()
    result = {"checkpoint": str(ckpt), "task": cfg.task, **result}
    (out / "eval.json").write_text(json.dumps(result, indent=2))
    console.print_json(json.dumps(result))
    console.print(f"wrote {out / 'eval.json'}")
    return result


def list_tasks() -> None:
    from rlrobot.envs.registry import describe_task, native_task_ids

    table = Table(title="rlrobot tasks")
    for col in ("task", "observation", "action", "max steps", "instruction"):
        table.add_column(col)
    for task in native_task_ids():
        d = describe_task(task)
        table.add_row(task, json.dumps(d["observation"]), str(d["action"]), str(d["max_episode_steps"]), d["instruction"])
    console.print(table)
    from rlrobot.envs.registry import task_spec

    for task in native_task_ids():
        spec = task_spec(task)
        console.print(f"{task}: obs_mode {' | '.join(spec.obs_modes)}; control_mode {' | '.join(spec.control_modes)}; "
                      f"reward_mode {' | '.join(spec.reward_modes)}")
    console.print("Other simulators by prefix: gym:<id> (any registered gymnasium env, e.g. gym:Pendulum-v1), "
                  "maniskill:<id> (extra maniskill, e.g. maniskill:PushCube-v1), isaaclab:<task> (Isaac Lab installed)")


def list_algorithms() -> None:
    from rlrobot.algorithms.registry import describe_algorithms

    table = Table(title="rlrobot algorithms (rlrobot train --algo NAME --help)")
    for col in ("algo", "policy kind", "what it does"):
        table.add_column(col)
    for row in describe_algorithms():
        table.add_row(row["algo"], row["policy_kind"], row["summary"])
    console.print(table)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        console.print("usage: rlrobot {" + ",".join(COMMANDS) + "} [options]   (rlrobot <command> --help)")
        return
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        console.print(f"[red]unknown command {command!r}; valid commands: {', '.join(COMMANDS)}[/]")
        raise SystemExit(2)
    try:
        if command == "train":
            train(rest)
        elif command == "eval":
            evaluate_checkpoint(tyro.cli(EvalArgs, args=rest, prog="rlrobot eval"))
        elif command == "collect":
            from rlrobot.commands.collect import CollectArgs, collect_demonstrations

            collect_demonstrations(tyro.cli(CollectArgs, args=rest, prog="rlrobot collect",
                                            description="Record scripted-expert demonstrations as a LeRobotDataset."))
        elif command == "list-tasks":
            list_tasks()
        elif command == "list-algos":
            list_algorithms()
        elif command == "bench":
            from rlrobot.bench.mujoco_bench import BenchArgs, run_bench

            run_bench(tyro.cli(BenchArgs, args=rest, prog="rlrobot bench"))
        elif command == "serve":
            from rlrobot.real_robot.server import ServeArgs, run_server

            run_server(tyro.cli(ServeArgs, args=rest, prog="rlrobot serve",
                                description="Serve a policy over a websocket (msgpack frames, HMAC-authenticated)."))
        elif command == "deploy":
            from rlrobot.real_robot.deploy import DeployArgs, run_deploy

            run_deploy(tyro.cli(DeployArgs, args=rest, prog="rlrobot deploy",
                                description="Run a policy on a robot (twin or LeRobot) through the safety supervisor."))
    except (ValueError, FileNotFoundError, FileExistsError, ImportError, ConnectionError) as e:
        console.print(f"[red]error:[/] {e}", soft_wrap=True)  # one line per error: greppable in logs
        raise SystemExit(2) from e


if __name__ == "__main__":
    main()
