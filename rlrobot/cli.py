"""``rlrobot`` command line: train, eval, collect, list-tasks, list-algos, bench, serve, deploy (tyro turns the
config dataclasses into flags; ``rlrobot train --algo X --help`` shows the options of algorithm X)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import tyro
from rich.console import Console
from rich.markup import escape
from rich.table import Table

console = Console(soft_wrap=True)  # long lines stay one line in logs (CI, nohup), not wrapped at 80 columns
COMMANDS = {
    "train": "train a policy (rlrobot train --algo X --help: the options of algorithm X)",
    "eval": "evaluate a checkpoint or run directory in its task",
    "collect": "record scripted-expert demonstrations as a LeRobotDataset",
    "datasets": "the offline-RL dataset recipes and what each dataset holds",
    "offline-bench": "offline RL table: tasks x recipes x algorithms x seeds at one gradient budget",
    "list-tasks": "the tasks with their spaces and modes",
    "list-algos": "the registered algorithms and the policy each trains",
    "bench": "physics vs VecEnv vs training throughput, baselines measured in the same run",
    "serve": "serve a policy over an authenticated websocket",
    "deploy": "run a policy on a robot (twin or LeRobot) through the safety supervisor",
    "compare": "several runs' curves on one PNG (env steps and wall clock) with a table",
    "results": "reproduce the README's results from the registry (run, table, list)",
    "prm-eval": "a process reward model on held-out episodes: progress curves (PNG), Spearman, done F1",
}
USAGE = ("usage: rlrobot <command> [options]       rlrobot <command> --help for its options\n\ncommands:\n"
         + "".join(f"  {name:<12} {what}\n" for name, what in COMMANDS.items())
         + "\n  -V, --version  print the version")


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


def parse_train_args(argv: list[str]):
    """The run config of a ``rlrobot train`` command line (preset of --task / --algo, then every flag), unvalidated."""
    from rlrobot.algorithms.registry import algorithm_spec
    from rlrobot.config import config_class

    argv = _normalise_numbers(argv)
    default = _preset_from_argv(argv)
    spec = algorithm_spec(default.algo)
    return tyro.cli(config_class(default.algo), default=default, args=argv, prog=f"rlrobot train --algo {spec.name}",
                    description=f"Train with {spec.name}: {spec.summary}. Presets in rlrobot.configs set the defaults "
                                "for each --task / --algo pair; other algorithms: rlrobot list-algos.")


def train(argv: list[str]) -> dict:
    argv = _normalise_numbers(argv)
    if _given(argv, "resume"):
        argv = _with_run_identity(argv)
    cfg = parse_train_args(argv)
    if _given(argv, "total_steps") and cfg.steps_per_iteration() == 0:
        raise ValueError(f"--total-steps does not apply to algo={cfg.algo!r}, which does not step the env; "
                         f"its budget is {cfg.spec.budget_flag()}")
    if cfg.resume:
        cfg = _resume_config(cfg, argv)
    cfg.prepare()
    from rlrobot.runners.base import make_runner

    summary = make_runner(cfg).learn()
    if summary.get("interrupted"):
        console.print(f"[yellow]interrupted[/] at iteration {summary['iteration']:,} ({summary['log_step']:,} "
                      f"{summary['x_label']}); checkpoint {summary['checkpoint']}", soft_wrap=True)
        console.print(f"  resume with:    {summary['resume_command']}", soft_wrap=True)
        return summary
    if "eval" not in summary:  # a rank other than 0 of a distributed run: rank 0 reports
        return summary
    ev = summary["eval"]
    if "success_rate" in ev or not ev:
        result = (f"eval success {ev.get('success_rate', 0):.3f}, return {ev.get('return_mean', 0):.2f} "
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
    from rlrobot.checkpoints import load_config, newest_intact_checkpoint

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
    from rlrobot.checkpoints import load_config, newest_intact_checkpoint
    from rlrobot.config import config_from_checkpoint

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


@dataclass
class EvalArgs:
    checkpoint: str
    """a checkpoint directory or a run directory (its latest checkpoint is used)"""
    episodes: int | None = None
    """episodes to evaluate (default: the run's eval_episodes)"""
    num_envs: int | None = None
    """envs stepped at once (default: the run's eval_envs)"""
    task: str | None = None
    """evaluate on another task than the one trained on (its spaces must match)"""
    seed: int | None = None
    """evaluation seed (default: the one the run's own final evaluation used, so the same checkpoint scores the same)"""
    video: bool = True
    out: str | None = None
    """where to write eval.json and the video (default: the checkpoint directory)"""
    device: str = "cpu"
    denoising_steps: int | None = None
    """flow policies: denoising steps K to sample with (default: the run's)"""
    execute_steps: int | None = None
    """flow policies: actions of each chunk executed open-loop before re-planning (default: the run's)"""


def evaluate_checkpoint(args: EvalArgs) -> dict:
    import torch

    import rlrobot
    from rlrobot.checkpoints import load_checkpoint
    from rlrobot.config import config_from_checkpoint
    from rlrobot.envs.seeds import evaluation_seed
    from rlrobot.policies.registry import build_policy, check_compatible, policy_metadata
    from rlrobot.runners.evaluation import evaluate

    for name in ("episodes", "num_envs"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(args, name)}")
    weights, saved, ckpt = load_checkpoint(args.checkpoint)
    cfg = config_from_checkpoint(saved)
    _override_flow_sampling(cfg, args)
    # the run's final evaluation: env seed cfg.seed + 1, episode seed from the evaluation stream (rlrobot.envs.seeds)
    episodes = args.episodes or cfg.eval_episodes
    num_envs = args.num_envs or cfg.eval_envs
    seed = evaluation_seed(cfg.seed) if args.seed is None else args.seed
    env_seed = cfg.seed + 1 if args.seed is None else args.seed
    if args.task is not None:
        from rlrobot.envs.registry import validate_task_id

        validate_task_id(args.task)
        cfg.task = args.task
    env = rlrobot.make(cfg.task, num_envs, backend=cfg.backend if args.task is None else None,
                       device=args.device, seed=env_seed, **cfg.task_options())
    try:
        check_compatible(saved, policy_metadata(cfg, env))
        policy = build_policy(saved, cfg)
        policy.load_state_dict(weights)
        policy.to(torch.device(args.device)).eval()
        out = Path(args.out) if args.out else ckpt
        out.mkdir(parents=True, exist_ok=True)
        result = evaluate(policy, env, episodes, seed=seed, video_path=out / "eval.mp4" if args.video else None)
        if hasattr(policy, "sample_actions"):
            result.update(chunk_timing(policy, env, seed))
    finally:
        env.close()
    same_as_run = args.seed is None and episodes == cfg.eval_episodes and num_envs == cfg.eval_envs and args.task is None
    result = {"checkpoint": str(ckpt), "task": cfg.task, "seed": seed, "num_envs": num_envs, **result}
    (out / "eval.json").write_text(json.dumps(result, indent=2))
    console.print(f"{cfg.task}: success {result['success_rate']:.3f}, return {result['return_mean']:.2f} "
                  f"+- {result['return_std']:.2f} over {result['episodes']} episodes", soft_wrap=True)
    for family, row in result.get("per_family", {}).items():
        console.print(f"  {family}: success {row['success_rate']:.3f} over {row['episodes']} episodes", soft_wrap=True)
    if "chunk_latency_ms" in result:
        calls = result["length_mean"] / result["execute_steps"]
        sampler = (f"K={result['denoising_steps']:.0f} denoising steps" if "denoising_steps" in result
                   else "autoregressive action tokens")
        console.print(f"  chunks: {sampler}, {result['execute_steps']:.0f} of "
                      f"{policy.chunk_size} actions executed ({result['chunk_utilisation']:.0%}), {calls:.1f} policy calls per "
                      f"episode, {result['chunk_latency_ms']:.2f} ms per chunk (batch 1)", soft_wrap=True)
    if "steps_to_success_mean" in result:
        console.print(f"  physical steps to first success: {result['steps_to_success_mean']:.1f} (mean over successful "
                      "episodes)", soft_wrap=True)
    if same_as_run:
        console.print("  same seed, episodes and envs as the run's own final evaluation: the latest checkpoint scores "
                      "what the run reported", soft_wrap=True)
    else:
        console.print(f"  seed {seed}, {episodes} episodes, {num_envs} envs: other episodes than the run's own final "
                      f"evaluation (seed {evaluation_seed(cfg.seed)}, {cfg.eval_episodes} episodes, {cfg.eval_envs} envs), so the "
                      "numbers differ by sampling", soft_wrap=True)
    console.print(f"  wrote {out / 'eval.json'}" + (f" and {result['video']}" if "video" in result else ""), soft_wrap=True)
    return result


def _override_flow_sampling(cfg, args: EvalArgs) -> None:
    if args.denoising_steps is None and args.execute_steps is None:
        return
    if not hasattr(cfg, "flow"):
        raise ValueError(f"--denoising-steps / --execute-steps apply to flow policies; {args.checkpoint} holds a "
                         f"{cfg.spec.policy_kind!r} policy")
    if args.denoising_steps is not None:
        if args.denoising_steps < 1:
            raise ValueError(f"denoising_steps must be >= 1, got {args.denoising_steps}")
        cfg.flow.denoising_steps = args.denoising_steps
    if args.execute_steps is not None:
        if not 1 <= args.execute_steps <= cfg.flow.chunk_size:
            raise ValueError(f"execute_steps must be in [1, chunk_size={cfg.flow.chunk_size}], got {args.execute_steps}")
        cfg.flow.execute_steps = args.execute_steps


def chunk_timing(policy, env, seed: int, calls: int = 50) -> dict[str, float]:
    """Latency of one deterministic chunk for one observation (what serving pays per re-plan), and chunk use."""
    import time

    import torch

    obs, _ = env.reset(seed=seed)
    one = {k: v[:1] for k, v in obs.items()}
    with torch.inference_mode():
        policy.sample_actions(one)  # warm-up
        start = time.perf_counter()
        for _ in range(calls):
            policy.sample_actions(one)
    execute = getattr(policy, "execute_steps", None) or policy.chunk_size
    timing = {"chunk_latency_ms": (time.perf_counter() - start) / calls * 1e3, "execute_steps": float(execute),
              "chunk_utilisation": execute / policy.chunk_size}
    if hasattr(policy, "denoising_steps"):  # flow policies (a token VLA decodes its chunk autoregressively)
        timing["denoising_steps"] = float(policy.denoising_steps)
    return timing


@dataclass
class ListTasksArgs:
    instructions: str | None = None
    """a language-suite task id (so101-suite, so101-pick-place, ...): print every instruction it draws, one per line
    (what `rlrobot train --instruction` takes)"""


def list_tasks(args: ListTasksArgs) -> None:
    from rlrobot.envs.registry import describe_task, native_task_ids

    if args.instructions is not None:
        from rlrobot.tasks.so101_suite import SUITE_TASKS

        if args.instructions not in SUITE_TASKS:
            raise ValueError(f"instructions={args.instructions!r} is not a language-suite task; one of {sorted(SUITE_TASKS)}")
        for text in SUITE_TASKS[args.instructions].instructions():
            print(text)
        return

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
        print(USAGE)
        return
    if argv[0] in ("-V", "--version"):
        import rlrobot

        print(f"rlrobot {rlrobot.__version__}")
        return
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        console.print(f"[red]unknown command {command!r}; valid commands: {', '.join(COMMANDS)}[/]", soft_wrap=True)
        raise SystemExit(2)
    try:
        if command == "train":
            if train(rest).get("interrupted"):
                raise SystemExit(130)  # 128 + SIGINT: scripts must not take an interrupted run for a finished one
        elif command == "eval":
            evaluate_checkpoint(tyro.cli(EvalArgs, args=rest, prog="rlrobot eval"))
        elif command == "collect":
            from rlrobot.commands.collect import CollectArgs, collect_demonstrations

            collect_demonstrations(tyro.cli(CollectArgs, args=rest, prog="rlrobot collect",
                                            description="Record scripted-expert demonstrations as a LeRobotDataset."))
        elif command == "datasets":
            from rlrobot.commands.datasets import DatasetsArgs, list_datasets

            list_datasets(tyro.cli(DatasetsArgs, args=rest, prog="rlrobot datasets"))
        elif command == "offline-bench":
            from rlrobot.commands.offline_bench import OfflineBenchArgs, run_offline_bench

            run_offline_bench(tyro.cli(OfflineBenchArgs, args=rest, prog="rlrobot offline-bench",
                                       description="Offline RL benchmark (issue 17): a Markdown table and learning curves."))
        elif command == "list-tasks":
            list_tasks(tyro.cli(ListTasksArgs, args=rest, prog="rlrobot list-tasks"))
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
        elif command == "compare":
            from rlrobot.commands.compare import CompareArgs, run_compare

            run_compare(tyro.cli(CompareArgs, args=rest, prog="rlrobot compare",
                                 description="Several runs' evaluation curves on one PNG (env steps and wall clock)."))
        elif command == "results":
            from rlrobot.commands.results import main as results_main

            results_main(rest)
        elif command == "prm-eval":
            from rlrobot.commands.prm_eval import PRMEvalArgs, run_prm_eval

            run_prm_eval(tyro.cli(PRMEvalArgs, args=rest, prog="rlrobot prm-eval"))
    except (ValueError, FileNotFoundError, FileExistsError, ImportError, ConnectionError) as e:
        # escaped: a message may hold brackets that are not markup ("pip install -e '.[vla]'")
        console.print(f"[red]error:[/] {escape(str(e))}", soft_wrap=True)  # one line per error: greppable in logs
        raise SystemExit(2) from e


if __name__ == "__main__":
    main()
