"""What every runner shares: the env, seeds, checkpoints (with simulator and RNG state), the learn loop with logging,
progress, periodic evaluation and the final summary. Subclasses supply one training iteration and their own state.
"""

from __future__ import annotations

import abc
import json
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

import rlrobot
from rlrobot.config import TrainConfig
from rlrobot.logging.loggers import Logger
from rlrobot.logging.plots import plot_learning_curve
from rlrobot.runners.checkpoint import load_checkpoint, load_trainer_state, save_checkpoint
from rlrobot.runners.evaluation import evaluate

console = Console()

POLICY_CLASSES = {"ppo": "ActorCritic", "sac": "SACPolicy", "sft": "FlowPolicy", "flow-noise": "FlowPolicy",
                  "flow-sde": "FlowPolicy"}


def policy_metadata(cfg: TrainConfig, env) -> dict[str, Any]:
    space = env.single_observation_space
    return {
        "policy_class": POLICY_CLASSES[cfg.algo],
        "task": cfg.task,
        "obs_dim": int(space["state"].shape[0]) if "state" in space.spaces else None,
        "action_dim": int(env.single_action_space.shape[0]),
        "observation_space": {k: list(v.shape) for k, v in env.single_observation_space.spaces.items()},
        "action_space": list(env.single_action_space.shape),
        "control_mode": cfg.control_mode if ":" not in cfg.task else None,
        "control_dt": float(getattr(env, "control_dt", 0.0)),
        "rlrobot_version": rlrobot.__version__,
    }


def build_policy(meta: dict[str, Any], cfg: TrainConfig) -> torch.nn.Module:
    """The policy a checkpoint's metadata describes, built from the run's config (weights loaded by the caller)."""
    from rlrobot.policies.actor_critic import ActorCritic
    from rlrobot.policies.flow import FlowPolicy
    from rlrobot.policies.sac_policy import SACPolicy

    cls = meta.get("policy_class", "ActorCritic")
    if cls == "ActorCritic":
        return ActorCritic(meta["obs_dim"], meta["action_dim"], cfg.policy)
    if cls == "SACPolicy":
        return SACPolicy(meta["obs_dim"], meta["action_dim"], cfg.policy, cfg.sac.num_critics, cfg.sac.critic_layer_norm)
    if cls == "FlowPolicy":
        shapes = {k: tuple(v) for k, v in meta["observation_space"].items()}
        policy = FlowPolicy(shapes, meta["action_dim"], cfg.flow)
        policy.execute_steps = cfg.executed_steps()  # evaluation and serving run chunks open-loop this long
        return policy
    raise ValueError(f"policy_class={cls!r} is not one of {sorted(set(POLICY_CLASSES.values()))}")


def check_compatible(saved: dict[str, Any], current: dict[str, Any]) -> None:
    """A checkpoint drives an env only if it was trained on the same spaces (and, by default, task)."""
    problems = []
    for key in ("obs_dim", "action_dim", "control_mode"):
        if saved.get(key) != current.get(key):
            problems.append(f"{key}: checkpoint {saved.get(key)!r} vs env {current.get(key)!r}")
    if problems:
        raise ValueError(f"checkpoint trained on task {saved.get('task')!r} does not match task {current.get('task')!r}: "
                         + "; ".join(problems))


class Runner(abc.ABC):
    """Base runner. Subclasses set ``self.policy`` and implement ``steps_per_iteration``, ``train_iteration``,
    ``trainer_state`` / ``restore_trainer_state`` (their algorithm's optimizers and counters)."""

    def __init__(self, cfg: TrainConfig):
        cfg.validate()
        self.cfg = cfg
        self.out = Path(cfg.run_dir())
        self.ckpt_dir = self.out / "checkpoints"
        torch.set_num_threads(cfg.torch_threads)
        if cfg.distributed:
            from rlrobot.runners.distributed import init_distributed

            self.sync, self.device = init_distributed(cfg.device)
        else:
            from rlrobot.runners.distributed import NoSync

            self.sync, self.device = NoSync(), torch.device(cfg.device)
        self.is_main = self.sync.rank == 0
        # each rank its own env batch, seed and exploration noise; parameters are broadcast from rank 0 at start
        self.seed = cfg.seed + 1000 * self.sync.rank
        torch.manual_seed(self.seed)
        self.env = rlrobot.make(cfg.task, cfg.num_envs, backend=cfg.backend, device=self.device, seed=self.seed,
                                **cfg.task_options())
        self.meta = policy_metadata(cfg, self.env)
        self.policy: torch.nn.Module
        self.iteration = 0
        self.env_steps = 0
        self.wall_time = 0.0
        self.obs: dict[str, torch.Tensor] | None = None
        self.recent_returns: deque[float] = deque(maxlen=200)
        self.recent_success: deque[float] = deque(maxlen=200)

    # ------------------------------------------------------------------ subclass hooks
    @property
    @abc.abstractmethod
    def steps_per_iteration(self) -> int:
        ...

    @abc.abstractmethod
    def train_iteration(self) -> dict[str, float]:
        """Collect ``steps_per_iteration`` env steps and learn from them; return metrics to log."""
        ...

    @abc.abstractmethod
    def trainer_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any], Any, dict[str, dict[str, torch.Tensor]]]:
        """(tensors, json meta, optimizer(s), extra safetensors files) of the algorithm, for a resumable checkpoint."""
        ...

    @abc.abstractmethod
    def restore_trainer_state(self, ckpt: Path, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        ...

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

    def status_line(self, metrics: dict[str, float]) -> str:
        return (f"{metrics['perf/env_steps_per_s']:,.0f} steps/s  return {metrics['train/return']:.2f}  "
                f"success {metrics['train/success']:.2f}")

    def after_restore(self, ckpt: Path) -> None:
        """Called once the env and RNG are restored (e.g. to report a cold replay buffer); optional."""
        return None

    # ------------------------------------------------------------------ checkpoints
    def config_dict(self) -> dict[str, Any]:
        return {"train": self.cfg.to_dict(), **self.meta}

    def save(self) -> Path:
        tensors, meta, optimizers, extra_files = self.trainer_state()
        tensors = {**tensors, "rng.torch": torch.get_rng_state()}
        meta = {**meta, "iteration": self.iteration, "env_steps": self.env_steps, "wall_time": self.wall_time,
                "env_state": None}
        if hasattr(self.env, "get_state"):
            state = self.env.get_state()
            for k, v in state["arrays"].items():
                tensors[f"env.{k}"] = torch.from_numpy(np.ascontiguousarray(v))
            meta["env_state"] = {"rng": state["rng"], "keys": list(state["arrays"])}
        return save_checkpoint(self.ckpt_dir, f"iter_{self.iteration:06d}", self.policy, self.config_dict(),
                               tensors, meta, optimizers, extra_files=extra_files)

    def restore(self) -> None:
        weights, config, ckpt = load_checkpoint(self.ckpt_dir)
        check_compatible(config, self.meta)
        if config.get("policy_class", "ActorCritic") != self.meta["policy_class"]:
            raise ValueError(f"checkpoint holds a {config.get('policy_class')} policy; algo={self.cfg.algo!r} trains "
                             f"a {self.meta['policy_class']}")
        self.policy.load_state_dict(weights)
        tensors, meta = load_trainer_state(ckpt)
        self.restore_trainer_state(ckpt, tensors, meta)
        self.iteration, self.env_steps, self.wall_time = meta["iteration"], meta["env_steps"], meta["wall_time"]
        torch.set_rng_state(tensors["rng.torch"])
        if meta["env_state"] is not None and hasattr(self.env, "set_state") and self.is_main:
            arrays = {k: tensors[f"env.{k}"].numpy() for k in meta["env_state"]["keys"]}
            self.env.set_state({"arrays": arrays, "rng": meta["env_state"]["rng"]})
            self.obs = self.env.observe()
        else:  # adapters without state access (and ranks other than 0, whose env state is not saved) restart
            self.obs, _ = self.env.reset(seed=self.seed + self.iteration)
        if self.is_main:
            console.print(f"resumed {ckpt} at iteration {self.iteration} ({self.env_steps} env steps)")
        self.after_restore(ckpt)

    # ------------------------------------------------------------------ training
    def track_episodes(self, info: dict[str, Any]) -> None:
        if "episode" in info:
            self.recent_returns.extend(info["episode"]["return"].tolist())
            self.recent_success.extend(info["episode"]["success"].float().tolist())

    def learn(self) -> dict[str, Any]:
        try:
            return self._learn()
        finally:
            if self.cfg.distributed:
                from rlrobot.runners.distributed import shutdown

                shutdown()

    def _learn(self) -> dict[str, Any]:
        cfg = self.cfg
        main = self.is_main  # rank 0 alone logs, checkpoints and evaluates
        if main:
            self.out.mkdir(parents=True, exist_ok=True)
        if cfg.resume:
            self.restore()
        else:
            if (self.ckpt_dir / "latest").exists():
                raise FileExistsError(f"{self.out} already holds a run; pass --resume to continue it or choose --out")
            self.obs, _ = self.env.reset(seed=self.seed)
            if main:
                (self.out / "metrics.jsonl").unlink(missing_ok=True)
        if self.sync.world_size > 1:
            from rlrobot.runners.distributed import broadcast_module

            broadcast_module(self.policy)
        if main:
            (self.out / "config.json").write_text(json.dumps(self.config_dict(), indent=2))
        logger = Logger(self.out, cfg.logger, self.config_dict(), cfg.wandb_project, cfg.wandb_mode,
                        run_name=self.out.name) if main else None
        per_iteration = self.steps_per_iteration * self.sync.world_size
        total_iterations = self.total_iterations
        eval_result: dict[str, Any] = {}
        progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                            TextColumn("{task.completed:,}/{task.total:,} iterations"), TextColumn("{task.fields[stats]}"),
                            TimeElapsedColumn(), console=console, disable=not (console.is_terminal and main))
        print_every = max(1, total_iterations // 100) if cfg.algo != "ppo" else 10
        try:
            with progress:
                bar = progress.add_task(cfg.task, total=total_iterations, completed=self.iteration, stats="")
                while self.iteration < total_iterations:
                    start = time.perf_counter()
                    iteration_metrics = self.train_iteration()
                    self.iteration += 1
                    self.env_steps += per_iteration
                    elapsed = time.perf_counter() - start
                    self.wall_time += elapsed
                    if not main:
                        continue
                    metrics = {
                        "train/return": float(np.mean(self.recent_returns)) if self.recent_returns else 0.0,
                        "train/success": float(np.mean(self.recent_success)) if self.recent_success else 0.0,
                        "perf/env_steps_per_s": per_iteration / elapsed,
                        "perf/iterations_per_s": 1.0 / elapsed,
                        "time/wall": self.wall_time,
                        **iteration_metrics,
                    }
                    logger.log(metrics, self.log_step)
                    progress.update(bar, completed=self.iteration, stats=self.status_line(metrics))
                    if not console.is_terminal and (self.iteration % print_every == 0 or self.iteration == total_iterations):
                        console.print(f"iter {self.iteration}/{total_iterations}  steps {self.env_steps:,}  "
                                      f"{self.status_line(metrics)}  t {self.wall_time:.0f}s")
                    if cfg.eval_every and self.iteration % cfg.eval_every == 0 and self.iteration < total_iterations:
                        eval_result = self.evaluate(video=False)
                        logger.log({f"eval/{k}": v for k, v in eval_result.items() if isinstance(v, float)}, self.log_step)
                        console.print(f"eval at iteration {self.iteration}: success {eval_result['success_rate']:.3f}, "
                                      f"return {eval_result['return_mean']:.2f}")
                    if self.iteration % cfg.checkpoint_every == 0 or self.iteration == total_iterations:
                        self.save()
            distributed: dict[str, Any] = {}
            if self.sync.world_size > 1:
                from rlrobot.runners.distributed import parameters_identical

                distributed = {"world_size": self.sync.world_size,
                               "parameters_identical": parameters_identical(self.policy, self.sync)}
            if not main:
                return {"rank": self.sync.rank, "env_steps": self.env_steps, "distributed": distributed}
            eval_result = self.evaluate(video=cfg.video)
            logger.log({f"eval/{k}": v for k, v in eval_result.items() if isinstance(v, float)}, self.log_step)
            if "video" in eval_result:
                logger.log_video(Path(eval_result["video"]), self.log_step)
        finally:
            if logger is not None:
                logger.close()
        curve = plot_learning_curve(self.out / "metrics.jsonl", self.out / "learning_curve.png", title=cfg.task)
        summary = {
            "run_dir": str(self.out),
            "checkpoint": str(self.ckpt_dir / (self.ckpt_dir / "latest").read_text().strip()),
            "learning_curve": str(curve),
            "env_steps": self.env_steps,
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
        cfg = self.cfg
        env = rlrobot.make(cfg.task, cfg.eval_envs, backend=cfg.backend, device=self.device, seed=cfg.seed + 1,
                           **cfg.task_options())
        try:
            path = self.out / "videos" / f"eval_{self.env_steps:09d}.mp4" if video else None
            return evaluate(self.policy, env, cfg.eval_episodes, seed=cfg.seed + 10_000, video_path=path,
                            video_episodes=cfg.video_episodes)
        finally:
            env.close()


def make_runner(cfg: TrainConfig) -> Runner:
    """The runner of ``cfg.algo``: on-policy (PPO), off-policy (SAC), flow SFT, or flow-policy PPO."""
    if cfg.algo == "sft":
        from rlrobot.runners.sft import SFTRunner

        return SFTRunner(cfg)
    if cfg.algo in ("flow-noise", "flow-sde"):
        from rlrobot.runners.flow_on_policy import FlowOnPolicyRunner

        return FlowOnPolicyRunner(cfg)
    if cfg.algo == "sac":
        from rlrobot.runners.off_policy import OffPolicyRunner

        return OffPolicyRunner(cfg)
    from rlrobot.runners.on_policy import OnPolicyRunner

    return OnPolicyRunner(cfg)
