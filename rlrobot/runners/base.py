"""What every runner shares: the env, seeds, checkpoints (with simulator and RNG state), the learn loop with logging,
progress, periodic evaluation and the final summary. Subclasses supply one training iteration and their own state.
"""

from __future__ import annotations

import abc
import contextlib
import json
import os
import shlex
import signal
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

import rlrobot
from rlrobot.checkpoints import load_checkpoint, load_trainer_state, newest_intact_checkpoint, save_checkpoint
from rlrobot.config import TrainConfig
from rlrobot.envs.seeds import ROLLOUT_SAMPLING, evaluation_seed, training_seed
from rlrobot.envs.vec_env import CURRICULUM
from rlrobot.logging.loggers import Logger
from rlrobot.logging.plots import plot_learning_curve
from rlrobot.policies.registry import build_policy, check_compatible, policy_kind_of, policy_metadata
from rlrobot.rewards.registry import NONE as NO_SHAPING
from rlrobot.runners.distributed import NoSync, broadcast_module, init_distributed, parameters_identical, shutdown
from rlrobot.runners.evaluation import evaluate
from rlrobot.runners.overlap import OverlappedUpdates
from rlrobot.tasks.mujoco_vec_env import default_num_threads

MAX_SCHEDULED_EVALUATIONS = 10
"""evaluations over a run without --eval-every (the learning curve's points)"""
SMALL_NETWORK_PARAMETERS = 4_000_000
"""below this many policy parameters ``--update-threads 0`` updates on one thread"""

console = Console(soft_wrap=True)  # long lines stay one line in logs (CI, nohup), not wrapped at 80 columns


class Runner(abc.ABC):
    """Base runner: env, seeds and generator, checkpoints, the learn loop. Subclasses build ``self.policy`` and
    ``self.algo`` (which owns its optimizers, storage and ``state_dict``) and implement ``train_iteration``."""

    cheap_env_steps: bool = False
    """an env step costs little beside the update (on-policy runners): evaluation is budgeted in env steps"""

    def __init__(self, cfg: TrainConfig):
        cfg.prepare()  # reads --init / --dataset (may adopt settings from them), then validates
        self.cfg = cfg
        self.out = Path(cfg.run_dir())
        self.ckpt_dir = self.out / "checkpoints"
        torch.set_num_threads(cfg.torch_threads)
        if cfg.distributed:
            self.sync, self.device = init_distributed(cfg.device)
        else:
            self.sync, self.device = NoSync(), torch.device(cfg.device)
        self.is_main = self.sync.rank == 0
        # each rank its own env batch, seed and exploration noise; parameters are broadcast from rank 0 at start
        self.seed = training_seed(cfg.seed, self.sync.rank)
        torch.manual_seed(self.seed)
        self.generator = torch.Generator(device=self.device).manual_seed(self.seed)  # minibatches, exploration
        self.env = rlrobot.make(cfg.task, cfg.num_envs, backend=cfg.backend, device=self.device, seed=self.seed,
                                reward_wrappers=cfg.reward_wrappers(), **cfg.task_options())
        self.meta = policy_metadata(cfg, self.env)
        self.policy: torch.nn.Module
        self.algo: Any
        self.iteration = 0
        self.env_steps = 0
        self.wall_time = 0.0
        self.initialised_from = ""  # a checkpoint this run fine-tunes (set by the runners that load --init)
        self.curriculum_metrics: dict[str, float] = {}
        self.obs: dict[str, torch.Tensor] | None = None
        self.recent_returns: deque[float] = deque(maxlen=200)
        self.recent_task_returns: deque[float] = deque(maxlen=200)  # the task's own return where a reward is shaped
        self.recent_success: deque[float] = deque(maxlen=200)
        self.overlap: OverlappedUpdates | None = None  # set by start_overlap (--ppo.overlap, --flow-ppo.overlap)

    # ------------------------------------------------------------------ subclass hooks
    @abc.abstractmethod
    def train_iteration(self) -> dict[str, float]:
        """Collect ``steps_per_iteration`` env steps and learn from them; return metrics to log."""
        ...

    def runner_state(self) -> dict[str, Any]:
        """Runner-level state to checkpoint besides the algorithm's (counters of the runner's own)."""
        return {}

    def load_runner_state(self, state: dict[str, Any]) -> None:
        return None

    def extra_checkpoint_files(self) -> tuple[dict[str, dict[str, torch.Tensor]], dict[str, Any]]:
        """(safetensors files, their JSON metadata) to write beside the trainer state, e.g. a replay buffer."""
        return {}, {}

    def load_extra_checkpoint_files(self, ckpt: Path, meta: dict[str, Any]) -> None:
        return None

    # ------------------------------------------------------------------ shared helpers
    @property
    def steps_per_iteration(self) -> int:
        return self.cfg.steps_per_iteration()

    def build_policy(self) -> torch.nn.Module:
        return build_policy(self.meta, self.cfg).to(self.device)

    def obs_specs(self, keys) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """(shape, dtype) of the observation keys the policy reads: images stay uint8 in storage."""
        space = self.env.single_observation_space
        return {k: (tuple(space[k].shape), torch.uint8 if np.dtype(space[k].dtype) == np.uint8 else torch.float32)
                for k in keys}

    @property
    def update_thread_count(self) -> int:
        """``--update-threads``, or for 0: one thread for a policy under SMALL_NETWORK_PARAMETERS (a second thread
        gains little there and costs several times over on a busy machine), every core for a larger one."""
        if self.cfg.update_threads:
            return self.cfg.update_threads
        if sum(p.numel() for p in self.policy.parameters()) < SMALL_NETWORK_PARAMETERS:
            return 1
        return default_num_threads()

    def start_overlap(self, storage) -> None:
        """Overlapped rollouts and updates (``rlrobot.runners.overlap``): the actor copy of ``self.policy``, a second
        storage like ``storage`` and the rollout's own random stream, seeded from the run's training seed stream."""
        generator = torch.Generator(device=self.device).manual_seed(training_seed(self.cfg.seed, self.sync.rank,
                                                                                  ROLLOUT_SAMPLING))
        self.overlap = OverlappedUpdates(self.policy, storage.empty_like(), generator, self.update_thread_count)

    def pauses_after(self, iteration: int) -> bool:
        """Whether the learn loop evaluates, checkpoints or ends once ``iteration`` iterations are done (an overlapped
        update must have finished by then)."""
        every = self.eval_interval()
        return (iteration >= self.total_iterations or iteration % self.cfg.checkpoint_every == 0
                or bool(every) and iteration % every == 0)

    def settle(self) -> None:
        """Wait for an overlapped update still running, so the policy and the algorithm's state are whole."""
        if self.overlap is not None:
            self.overlap.wait()

    @contextlib.contextmanager
    def all_cores(self) -> Iterator[None]:
        """torch on the update's threads while the simulator is idle (updates), then back to the rollout thread count."""
        torch.set_num_threads(self.update_thread_count)
        try:
            yield
        finally:
            torch.set_num_threads(self.cfg.torch_threads)

    @property
    def total_iterations(self) -> int:
        """``total_steps`` counts env steps over all ranks."""
        return self.cfg.total_steps // (self.steps_per_iteration * self.sync.world_size)

    @property
    def data_parallel(self):
        """The sync object algorithms reduce through (None in one process)."""
        return self.sync if self.sync.world_size > 1 else None

    def gather_obs(self, obs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Every rank's observations (for the normaliser, which must see the same data on every rank)."""
        return {k: self.sync.gather(v) for k, v in obs.items()}

    @property
    def log_step(self) -> int:
        """x-axis of the logs: env steps (gradient steps for runners that do not step the env)."""
        return self.env_steps

    def after_restore(self, ckpt: Path) -> None:
        """Called once the env and RNG are restored (e.g. to report a cold replay buffer); optional."""
        return None

    # ------------------------------------------------------------------ checkpoints
    def config_dict(self) -> dict[str, Any]:
        return {"train": self.cfg.to_dict(), **self.meta}

    def save(self) -> Path:
        self.settle()
        extra_files, extra_meta = self.extra_checkpoint_files()
        state: dict[str, Any] = {
            "algorithm": self.algo.state_dict(), "runner": self.runner_state(), "extra_files": extra_meta,
            "rng": {"torch": torch.get_rng_state(), "generator": self.generator.get_state()},
            "iteration": self.iteration, "env_steps": self.env_steps, "wall_time": self.wall_time, "env": None,
        }
        if self.overlap is not None:
            state["rng"]["rollout_generator"] = self.overlap.generator.get_state()
        if hasattr(self.env, "get_state"):
            env_state = self.env.get_state()
            state["env"] = {"rng": env_state["rng"],
                            "arrays": {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in env_state["arrays"].items()}}
        return save_checkpoint(self.ckpt_dir, f"iter_{self.iteration:06d}", self.policy, self.config_dict(), state,
                               extra_files=extra_files)

    def restore(self) -> None:
        ckpt = newest_intact_checkpoint(self.ckpt_dir, report=lambda m: console.print(f"[yellow]{m}[/]", soft_wrap=True))
        weights, config, ckpt = load_checkpoint(ckpt)
        check_compatible(config, self.meta)
        if policy_kind_of(config) != self.meta["policy_kind"]:
            raise ValueError(f"checkpoint holds a {policy_kind_of(config)!r} policy; algo={self.cfg.algo!r} trains a "
                             f"{self.meta['policy_kind']!r} policy")
        state = load_trainer_state(ckpt)
        self.policy.load_state_dict(weights)
        self.algo.load_state_dict(state["algorithm"])
        self.load_runner_state(state["runner"])
        self.load_extra_checkpoint_files(ckpt, state["extra_files"])
        self.iteration, self.env_steps, self.wall_time = state["iteration"], state["env_steps"], state["wall_time"]
        torch.set_rng_state(state["rng"]["torch"])
        self.generator.set_state(state["rng"]["generator"])
        if self.overlap is not None and "rollout_generator" in state["rng"]:
            self.overlap.generator.set_state(state["rng"]["rollout_generator"])
        if not self.is_main:  # the checkpoint holds rank 0's streams; other ranks keep their own exploration noise
            torch.manual_seed(self.seed + self.iteration)
            self.generator.manual_seed(self.seed + self.iteration)
        if state["env"] is not None and hasattr(self.env, "set_state") and self.is_main:
            arrays = {k: v.numpy() for k, v in state["env"]["arrays"].items()}
            self.env.set_state({"arrays": arrays, "rng": state["env"]["rng"]})
            self.obs = self.env.observe()
        else:  # adapters without state access (and ranks other than 0, whose env state is not saved) restart
            self.obs, _ = self.env.reset(seed=training_seed(self.cfg.seed, self.sync.rank, self.iteration))
        if self.is_main:
            console.print(f"resumed {ckpt} at iteration {self.iteration} ({self.env_steps} env steps)")
        self.after_restore(ckpt)

    # ------------------------------------------------------------------ training
    def track_episodes(self, info: dict[str, Any]) -> None:
        if CURRICULUM in info:  # a training-env curriculum's state (JSRL's guide: h, stage, guided share)
            self.curriculum_metrics = info[CURRICULUM]
        if "episode" in info:
            self.recent_returns.extend(info["episode"]["return"].tolist())
            if "task_return" in info["episode"]:
                self.recent_task_returns.extend(info["episode"]["task_return"].tolist())
            self.recent_success.extend(info["episode"]["success"].float().tolist())

    def learn(self) -> dict[str, Any]:
        try:
            return self._learn()
        finally:
            if self.overlap is not None:
                self.overlap.close()
            if self.cfg.distributed:
                shutdown()

    @property
    def eval_return_label(self) -> str:
        """Evaluation scores the task's own reward: named so where training's is shaped."""
        return "task return" if self.cfg.reward.shaping != NO_SHAPING else "return"

    @property
    def x_label(self) -> str:
        """What ``log_step`` counts (the learning curve's x axis)."""
        return "env steps"

    def scheduled_evaluations(self) -> int:
        """How many evaluations ``eval_every=None`` spreads over the run: ten; for a runner whose env steps are cheap
        beside its updates (on-policy), fewer where their env steps would exceed a fifth of the training's (a short run
        is not mostly evaluation); at least the final one."""
        cfg = self.cfg
        if not self.cheap_env_steps:
            return MAX_SCHEDULED_EVALUATIONS
        per_evaluation = cfg.eval_episodes * (cfg.episode_steps() or 1000)
        return max(1, min(MAX_SCHEDULED_EVALUATIONS, cfg.total_steps // (5 * per_evaluation)))

    def eval_interval(self) -> int:
        """Iterations between evaluations: ``eval_every``, or ``scheduled_evaluations`` over the run when it is None
        (0: at the end)."""
        if self.cfg.eval_every is None:
            return max(1, self.total_iterations // self.scheduled_evaluations())
        return self.cfg.eval_every

    def _start(self) -> None:
        """Fresh run: reset the env; resumed run: restore the newest intact checkpoint and drop the metrics rows logged
        after it (they belong to iterations that are redone). The run directory is made only once that worked."""
        if self.cfg.resume:
            self.restore()
            if self.is_main:
                truncate_metrics(self.out / "metrics.jsonl", self.log_step)
        else:
            if (self.ckpt_dir / "latest").exists():
                raise FileExistsError(f"{self.out} already holds a run; pass --resume to continue it or choose --out")
            self.obs, _ = self.env.reset(seed=self.seed)
            if self.is_main:
                self.out.mkdir(parents=True, exist_ok=True)
                (self.out / "metrics.jsonl").unlink(missing_ok=True)
        if self.sync.world_size > 1:
            broadcast_module(self.policy)
        if self.is_main:
            (self.out / "config.json").write_text(json.dumps(self.config_dict(), indent=2))

    def _iteration_metrics(self, iteration_metrics: dict[str, float], elapsed: float, per_iteration: int
                           ) -> dict[str, float]:
        metrics = {"perf/iterations_per_s": 1.0 / elapsed, "time/wall": self.wall_time, **iteration_metrics,
                   **self.curriculum_metrics}
        if per_iteration:
            metrics["perf/env_steps_per_s"] = per_iteration / elapsed
        if self.recent_returns:  # only what was measured: nothing before the first episode ends
            metrics["train/return"] = float(np.mean(self.recent_returns))
            metrics["train/success"] = float(np.mean(self.recent_success))
        if self.recent_task_returns:
            metrics["train/task_return"] = float(np.mean(self.recent_task_returns))
        return metrics

    def status_line(self, metrics: dict[str, float]) -> str:
        parts = [f"{metrics['perf/env_steps_per_s']:,.0f} steps/s"] if "perf/env_steps_per_s" in metrics else []
        if "train/task_return" in metrics:  # a shaped reward: both, each named
            parts.append(f"shaped return {metrics['train/return']:.2f}  task return {metrics['train/task_return']:.2f}  "
                         f"success {metrics['train/success']:.2f}")
        elif "train/return" in metrics:
            parts.append(f"return {metrics['train/return']:.2f}  success {metrics['train/success']:.2f}")
        else:
            parts.append("no episode finished yet")
        return "  ".join(parts)

    def _learn(self) -> dict[str, Any]:
        cfg = self.cfg
        main = self.is_main  # rank 0 alone logs, checkpoints and evaluates
        self._start()
        logger = Logger(self.out, cfg.logger, self.config_dict(), cfg.wandb_project, cfg.wandb_mode,
                        run_name=self.out.name) if main else None
        if main:
            console.print(f"run dir {self.out}  ({cfg.algo} on {cfg.task}, {self.total_iterations:,} iterations)",
                          soft_wrap=True)
            if self.x_label == "env steps" and cfg.total_steps % (self.steps_per_iteration * self.sync.world_size):
                per_iteration = self.steps_per_iteration * self.sync.world_size
                console.print(f"--total-steps {cfg.total_steps:,} runs {self.total_iterations * per_iteration:,} env steps: "
                              f"whole iterations of {per_iteration:,} (envs x steps per env per iteration)", soft_wrap=True)
            if note := cfg.unread_cameras_note():
                console.print(note, soft_wrap=True)
            if cfg.eval_every is None and self.scheduled_evaluations() < MAX_SCHEDULED_EVALUATIONS:
                n = self.scheduled_evaluations()
                when = "once, at the end," if n == 1 else f"{n} times (the last at the end)"
                console.print(f"a short run: evaluated {when} instead of {MAX_SCHEDULED_EVALUATIONS} times, so that evaluating "
                              f"stays under a fifth of training; --eval-every sets it", soft_wrap=True)
        eval_result: dict[str, Any] = {}
        if main and self.initialised_from and self.iteration == 0:  # where fine-tuning starts: the curve's first point
            eval_result = self.evaluate(video=False)
            logger.log({f"eval/{k}": v for k, v in eval_result.items() if isinstance(v, float)}, self.log_step)
            console.print(f"evaluation of {self.initialised_from} before training: success "
                          f"{eval_result.get('success_rate', 0.0):.3f}, "
                          f"{self.eval_return_label} {eval_result.get('return_mean', 0.0):.2f}", soft_wrap=True)
        stop = StopAtIterationBoundary(enabled=main and self.sync.world_size == 1)
        try:
            with stop, self._progress() as advance:
                while self.iteration < self.total_iterations and not stop.requested:
                    metrics = self._train_and_log(logger)
                    if main:
                        advance(metrics)
                        eval_result = self._periodic_eval(logger) or eval_result
                    if main and (self.iteration % cfg.checkpoint_every == 0 or self.iteration == self.total_iterations
                                 or stop.requested):
                        self.save()  # rank 0 alone: ranks writing one directory race on its rename
            if stop.requested:
                return self._interrupted_summary()
            distributed = self._distributed_check()
            if not main:
                return {"rank": self.sync.rank, "env_steps": self.env_steps, "distributed": distributed}
            eval_result = self.evaluate(video=cfg.video)
            logger.log({f"eval/{k}": v for k, v in eval_result.items() if isinstance(v, float)}, self.log_step)
            if "video" in eval_result:
                logger.log_video(Path(eval_result["video"]), self.log_step)
        finally:
            if logger is not None:
                logger.close()
        return self._write_summary(eval_result, distributed)

    def _train_and_log(self, logger: Logger | None) -> dict[str, float]:
        per_iteration = self.steps_per_iteration * self.sync.world_size
        start = time.perf_counter()
        iteration_metrics = self.train_iteration()
        self.iteration += 1
        self.env_steps += per_iteration
        elapsed = time.perf_counter() - start
        self.wall_time += elapsed
        metrics = self._iteration_metrics(iteration_metrics, elapsed, per_iteration)
        if logger is not None:
            logger.log(metrics, self.log_step)
        return metrics

    def _periodic_eval(self, logger: Logger) -> dict[str, Any] | None:
        every = self.eval_interval()
        if not every or self.iteration % every or self.iteration >= self.total_iterations:
            return None
        result = self.evaluate(video=False)
        logger.log({f"eval/{k}": v for k, v in result.items() if isinstance(v, float)}, self.log_step)
        console.print(f"eval at iteration {self.iteration}: success {result['success_rate']:.3f}, "
                      f"{self.eval_return_label} {result['return_mean']:.2f}", soft_wrap=True)
        return result

    @contextlib.contextmanager
    def _progress(self) -> Iterator[Any]:
        """A rich progress bar with ETA on a terminal; elsewhere (CI, nohup, files) plain unwrapped lines, about 50
        per run, the first after the first iteration."""
        total = self.total_iterations
        terminal = console.is_terminal and self.is_main
        progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[stats]}"), TimeElapsedColumn(), TextColumn("eta"),
                            TimeRemainingColumn(), console=console, disable=not terminal)
        print_every = max(1, total // 50)
        started = self.iteration
        with progress:
            bar = progress.add_task(self.cfg.task, total=total, completed=self.iteration, stats="")

            def advance(metrics: dict[str, float]) -> None:
                progress.update(bar, completed=self.iteration, stats=self.status_line(metrics))
                if not terminal and (self.iteration % print_every == 0 or self.iteration == total
                                     or self.iteration == started + 1):
                    done = f"updates {self.log_step:,}" if self.x_label != "env steps" else f"steps {self.env_steps:,}"
                    print(f"iter {self.iteration}/{total}  {done}  {self.status_line(metrics)}  t {self.wall_time:.0f}s",
                          flush=True)

            yield advance

    def _distributed_check(self) -> dict[str, Any]:
        if self.sync.world_size == 1:
            return {}

        return {"world_size": self.sync.world_size, "parameters_identical": parameters_identical(self.policy, self.sync)}

    def _interrupted_summary(self) -> dict[str, Any]:
        ckpt = self.ckpt_dir / (self.ckpt_dir / "latest").read_text().strip()
        summary = {"run_dir": str(self.out), "checkpoint": str(ckpt), "interrupted": True, "iteration": self.iteration,
                   "env_steps": self.env_steps, "log_step": self.log_step, "x_label": self.x_label,
                   "resume_command": shlex.join(["rlrobot", "train", "--resume", "--out", str(self.out)])}
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary

    def _write_summary(self, eval_result: dict[str, Any], distributed: dict[str, Any]) -> dict[str, Any]:
        curve = plot_learning_curve(self.out / "metrics.jsonl", self.out / "learning_curve.png", title=self.cfg.task,
                                    x_label=self.x_label)
        summary = {
            "run_dir": str(self.out),
            "checkpoint": str(self.ckpt_dir / (self.ckpt_dir / "latest").read_text().strip()),
            "learning_curve": str(curve),
            "env_steps": self.env_steps,
            "log_step": self.log_step,
            "x_label": self.x_label,
            "train_wall_time_s": round(self.wall_time, 1),
            "eval": eval_result,
        }
        if distributed:
            summary["distributed"] = distributed
            if not distributed["parameters_identical"]:
                console.print("[red]parameters differ across ranks at the end of training[/]")
        (self.out / "eval.json").write_text(json.dumps(eval_result, indent=2))
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary

    def evaluate(self, video: bool) -> dict[str, Any]:
        self.settle()
        cfg = self.cfg
        env = rlrobot.make(cfg.task, cfg.eval_envs, backend=cfg.backend, device=self.device, seed=cfg.seed + 1,
                           **cfg.task_options())
        try:
            path = self.out / "videos" / f"eval_{self.env_steps:09d}.mp4" if video else None
            return evaluate(self.policy, env, cfg.eval_episodes, seed=evaluation_seed(cfg.seed), video_path=path,
                            video_episodes=cfg.video_episodes)
        finally:
            env.close()


def truncate_metrics(path: Path, last_step: int) -> None:
    """Keep the metrics rows up to ``last_step`` (a resumed run redoes what came after its checkpoint)."""
    if not path.is_file():
        return
    rows = [line for line in path.read_text().splitlines() if line.strip()]
    kept = [line for line in rows if json.loads(line).get("env_steps", 0) <= last_step]
    if len(kept) != len(rows):
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp, path)


class StopAtIterationBoundary:
    """Ctrl-C (SIGINT) during training: the first one lets the current iteration finish, then the runner checkpoints
    and returns; a second one aborts at once (KeyboardInterrupt). Only in the main thread of a single process (ranks
    of a distributed run would stop at different iterations)."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.requested = False
        self._previous: Any = None

    def _handler(self, signum, frame) -> None:
        if self.requested:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt
        self.requested = True
        console.print("[yellow]Ctrl-C: stopping after this iteration and saving a checkpoint (Ctrl-C again to abort "
                      "without saving)[/]", soft_wrap=True)

    def __enter__(self) -> StopAtIterationBoundary:
        if self.enabled:
            self._previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        if self.enabled:
            signal.signal(signal.SIGINT, self._previous)


def make_runner(cfg: TrainConfig) -> Runner:
    """The runner the algorithm registered (on-policy, off-policy, SFT, flow-policy PPO, ...)."""
    return cfg.spec.runner_class()(cfg)
