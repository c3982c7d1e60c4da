"""On-policy runner: rollout (under inference mode) -> PPO update -> log / evaluate / checkpoint, resumable."""

from __future__ import annotations

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
from rlrobot.algorithms.ppo import PPO
from rlrobot.config import TrainConfig
from rlrobot.data.rollout_storage import RolloutStorage
from rlrobot.logging.loggers import Logger
from rlrobot.logging.plots import plot_learning_curve
from rlrobot.policies.actor_critic import ActorCritic
from rlrobot.runners.checkpoint import (
    load_checkpoint,
    load_trainer_state,
    restore_optimizer,
    save_checkpoint,
)
from rlrobot.runners.evaluation import evaluate

console = Console()


def policy_metadata(cfg: TrainConfig, env) -> dict[str, Any]:
    return {
        "policy_class": "ActorCritic",
        "task": cfg.task,
        "obs_dim": int(env.single_observation_space[cfg.policy.obs_key].shape[0]),
        "action_dim": int(env.single_action_space.shape[0]),
        "observation_space": {k: list(v.shape) for k, v in env.single_observation_space.spaces.items()},
        "action_space": list(env.single_action_space.shape),
        "control_mode": cfg.control_mode if ":" not in cfg.task else None,
        "control_dt": float(getattr(env, "control_dt", 0.0)),
        "rlrobot_version": rlrobot.__version__,
    }


def build_policy(meta: dict[str, Any], cfg: TrainConfig) -> ActorCritic:
    return ActorCritic(meta["obs_dim"], meta["action_dim"], cfg.policy)


class OnPolicyRunner:
    def __init__(self, cfg: TrainConfig):
        cfg.validate()
        self.cfg = cfg
        self.out = Path(cfg.run_dir())
        self.ckpt_dir = self.out / "checkpoints"
        torch.set_num_threads(cfg.torch_threads)
        torch.manual_seed(cfg.seed)
        self.device = torch.device(cfg.device)
        self.env = rlrobot.make(cfg.task, cfg.num_envs, backend=cfg.backend, device=self.device, seed=cfg.seed,
                                **cfg.task_options())
        self.meta = policy_metadata(cfg, self.env)
        self.policy = build_policy(self.meta, cfg).to(self.device)
        self.algo = PPO(self.policy, cfg.ppo, self.device)
        space = self.env.single_observation_space
        key = cfg.policy.obs_key
        self.storage = RolloutStorage(cfg.ppo.num_steps, cfg.num_envs, {key: space[key].shape},
                                      self.meta["action_dim"], self.device)
        self.generator = torch.Generator(device=self.device).manual_seed(cfg.seed)
        self.iteration = 0
        self.env_steps = 0
        self.wall_time = 0.0
        self.obs: dict[str, torch.Tensor] | None = None
        self.recent_returns: deque[float] = deque(maxlen=200)
        self.recent_success: deque[float] = deque(maxlen=200)

    # ------------------------------------------------------------------ checkpoints
    def config_dict(self) -> dict[str, Any]:
        return {"train": self.cfg.to_dict(), **self.meta}

    def save(self) -> Path:
        tensors: dict[str, torch.Tensor] = {"rng.torch": torch.get_rng_state(), "rng.generator": self.generator.get_state()}
        meta: dict[str, Any] = {"iteration": self.iteration, "env_steps": self.env_steps, "lr": self.algo.lr,
                                "wall_time": self.wall_time, "env_state": None}
        if hasattr(self.env, "get_state"):
            state = self.env.get_state()
            for k, v in state["arrays"].items():
                tensors[f"env.{k}"] = torch.from_numpy(np.ascontiguousarray(v))
            meta["env_state"] = {"rng": state["rng"], "keys": list(state["arrays"])}
        return save_checkpoint(self.ckpt_dir, f"iter_{self.iteration:06d}", self.policy, self.config_dict(),
                               tensors, meta, self.algo.optimizer)

    def restore(self) -> None:
        weights, config, ckpt = load_checkpoint(self.ckpt_dir)
        check_compatible(config, self.meta)
        self.policy.load_state_dict(weights)
        tensors, meta = load_trainer_state(ckpt)
        restore_optimizer(self.algo.optimizer, tensors, meta)
        self.algo.lr = meta["lr"]
        for group in self.algo.optimizer.param_groups:
            group["lr"] = self.algo.lr
        self.iteration, self.env_steps, self.wall_time = meta["iteration"], meta["env_steps"], meta["wall_time"]
        torch.set_rng_state(tensors["rng.torch"])
        self.generator.set_state(tensors["rng.generator"])
        if meta["env_state"] is not None and hasattr(self.env, "set_state"):
            arrays = {k: tensors[f"env.{k}"].numpy() for k in meta["env_state"]["keys"]}
            self.env.set_state({"arrays": arrays, "rng": meta["env_state"]["rng"]})
            self.obs = self.env.observe()
        else:  # adapters without state access restart their episodes
            self.obs, _ = self.env.reset(seed=self.cfg.seed + self.iteration)
        console.print(f"resumed {ckpt} at iteration {self.iteration} ({self.env_steps} env steps)")

    # ------------------------------------------------------------------ training
    def learn(self) -> dict[str, Any]:
        cfg = self.cfg
        self.out.mkdir(parents=True, exist_ok=True)
        if cfg.resume:
            self.restore()
        else:
            if (self.ckpt_dir / "latest").exists():
                raise FileExistsError(f"{self.out} already holds a run; pass --resume to continue it or choose --out")
            self.obs, _ = self.env.reset(seed=cfg.seed)
            (self.out / "metrics.jsonl").unlink(missing_ok=True)
        (self.out / "config.json").write_text(json.dumps(self.config_dict(), indent=2))
        logger = Logger(self.out, cfg.logger, self.config_dict(), cfg.wandb_project, cfg.wandb_mode,
                        run_name=self.out.name)
        per_iteration = cfg.num_envs * cfg.ppo.num_steps
        total_iterations = cfg.total_steps // per_iteration
        eval_result: dict[str, Any] = {}
        progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed:,}/{task.total:,} steps"),
                            TextColumn("{task.fields[stats]}"), TimeElapsedColumn(), console=console,
                            disable=not console.is_terminal)
        try:
            with progress:
                bar = progress.add_task(cfg.task, total=total_iterations * per_iteration, completed=self.env_steps, stats="")
                while self.iteration < total_iterations:
                    start = time.perf_counter()
                    rollout_stats = self._rollout()
                    rollout_time = time.perf_counter() - start
                    update_stats = self.update()
                    self.iteration += 1
                    self.env_steps += per_iteration
                    elapsed = time.perf_counter() - start
                    self.wall_time += elapsed
                    metrics = {
                        "train/return": float(np.mean(self.recent_returns)) if self.recent_returns else 0.0,
                        "train/success": float(np.mean(self.recent_success)) if self.recent_success else 0.0,
                        "perf/env_steps_per_s": per_iteration / elapsed,
                        "perf/rollout_fraction": rollout_time / elapsed,
                        "time/wall": self.wall_time,
                        **{f"loss/{k}": v for k, v in update_stats.items()},
                        **rollout_stats,
                    }
                    logger.log(metrics, self.env_steps)
                    progress.update(bar, completed=self.env_steps, stats=(
                        f"{metrics['perf/env_steps_per_s']:,.0f} steps/s  return {metrics['train/return']:.2f}  "
                        f"success {metrics['train/success']:.2f}"))
                    if not console.is_terminal and (self.iteration % 10 == 0 or self.iteration == total_iterations):
                        console.print(f"iter {self.iteration}/{total_iterations}  steps {self.env_steps:,}  "
                                      f"{metrics['perf/env_steps_per_s']:,.0f} steps/s  return {metrics['train/return']:.2f}  "
                                      f"success {metrics['train/success']:.2f}  t {self.wall_time:.0f}s")
                    if cfg.eval_every and self.iteration % cfg.eval_every == 0 and self.iteration < total_iterations:
                        eval_result = self.evaluate(video=False)
                        logger.log({f"eval/{k}": v for k, v in eval_result.items() if isinstance(v, float)}, self.env_steps)
                    if self.iteration % cfg.checkpoint_every == 0 or self.iteration == total_iterations:
                        self.save()
            eval_result = self.evaluate(video=cfg.video)
            logger.log({f"eval/{k}": v for k, v in eval_result.items() if isinstance(v, float)}, self.env_steps)
            if "video" in eval_result:
                logger.log_video(Path(eval_result["video"]), self.env_steps)
        finally:
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
        (self.out / "eval.json").write_text(json.dumps(eval_result, indent=2))
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary

    def update(self) -> dict[str, float]:
        """PPO update with all cores for torch (the simulator threads are idle now), then back to rollout threads."""
        from rlrobot.tasks.mujoco_vec_env import default_num_threads

        torch.set_num_threads(self.cfg.update_threads or default_num_threads())
        try:
            stats = self.algo.update(self.storage, self.generator)
            self.policy.update_normalizer(self.storage.obs)
        finally:
            torch.set_num_threads(self.cfg.torch_threads)
        self.storage.clear()
        return stats

    def _rollout(self) -> dict[str, float]:
        cfg, env, policy, algo = self.cfg, self.env, self.policy, self.algo
        key = cfg.policy.obs_key
        gamma = cfg.ppo.gamma
        with torch.inference_mode():
            obs = self.obs
            for _ in range(cfg.ppo.num_steps):
                action, log_prob, value, mean, std = algo.act(obs)
                next_obs, reward, terminated, truncated, info = env.step(action.clamp(-1.0, 1.0))
                if truncated.any():
                    # bootstrap time-outs with the value of the true final observation (same-step autoreset)
                    final_value = policy.value(info["final_obs"])
                    reward = reward + gamma * final_value * truncated.float()
                self.storage.add({key: obs[key]}, action, log_prob, value, reward,
                                 (terminated | truncated).float(), mean, std)
                if "episode" in info:
                    self.recent_returns.extend(info["episode"]["return"].tolist())
                    self.recent_success.extend(info["episode"]["success"].float().tolist())
                obs = next_obs
            last_values = policy.value(obs)
        self.obs = obs
        self.storage.compute_returns(last_values, gamma, cfg.ppo.lam)
        return {"train/value_mean": float(self.storage.values.mean())}

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


def check_compatible(saved: dict[str, Any], current: dict[str, Any]) -> None:
    """A checkpoint drives an env only if it was trained on the same spaces (and, by default, task)."""
    problems = []
    for key in ("obs_dim", "action_dim", "control_mode"):
        if saved.get(key) != current.get(key):
            problems.append(f"{key}: checkpoint {saved.get(key)!r} vs env {current.get(key)!r}")
    if problems:
        raise ValueError(f"checkpoint trained on task {saved.get('task')!r} does not match task {current.get('task')!r}: "
                         + "; ".join(problems))
