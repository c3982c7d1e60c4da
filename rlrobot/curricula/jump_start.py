"""Jump-Start RL (JSRL; Uchendu et al. 2023): a guide policy rolls in for the first h steps of every training episode,
the learner acts for the rest, and h shrinks from H to 0 as the learner becomes able to finish from earlier states.

Works for any learner whose runner steps the training env step by step: PPO, SAC and flow-policy PPO
(``--jsrl.guide expert|RUN_DIR``). Pieces:

- ``JSRLConfig`` (``--jsrl.*``), in the run config of the algorithms whose spec lists ``JSRLInput``.
- ``GuidedEnv``: a wrapper of the *training* env only (it is built with the training env's wrappers, the evaluation
  env never gets it, so evaluation always runs the learner alone). Per env and on the device it counts the steps of
  the episode, replaces the learner's action by the guide's while ``t < h`` and reports, in
  ``info[POLICY_ACTED]``, which envs acted with the learner's action at this step. Guide steps always precede learner
  steps within an episode (h is fixed per episode in the random variant and only shrinks in the curriculum).
- ``HorizonCurriculum``: h_s = round(H (n - s) / n) for stages s = 0..n (stage 0: the guide alone for H steps,
  stage n: h = 0, the learner alone). Each finished training episode (the combined guide-then-learner policy, the
  policy JSRL evaluates to decide the stage) adds its success to a moving window of the last ``window`` episodes of
  the current stage; once the window is full, with  m = the window's mean  and  best = the best m seen so far,
  the stage advances when  m >= best - tolerance * |best|  and  m > 0,  and the window restarts (m > 0: a stage
  whose combined policy never succeeds has nothing to hold, and with best = 0 the rule alone would advance at once,
  shrinking the guide's help while nothing is learnt). The curriculum's evaluation is
  the guided training episodes themselves: no extra env steps (the learner-alone evaluation of the run is separate).
  The ``random`` variant draws h uniformly in {0, ..., H-1} for each episode and has no stages.
- The learner's training data are its own steps only: the runners pass ``info[POLICY_ACTED]`` to the rollout storage
  as a mask (PPO / flow-PPO losses and advantage normalisation skip guide steps) and to the replay buffer as ``keep``
  (SAC's replay never receives a guide transition).

Value targets of guide steps (PPO): GAE runs through whole episodes as usual, so a guide step's return is the
discounted return of the combined policy from that state. Those steps are excluded from the value loss too (V is the
learner's value), and no learner step's target reads them: guide steps precede the learner's steps in an episode and
GAE runs backwards, cut at episode ends, so learner advantages only bootstrap from learner states of the same
episode (or from V(final_obs) at a time-out).

The curriculum state (stage, h, best, window, per-env step counters, the random variant's generator) travels with
the env state in every checkpoint (``get_state`` / ``set_state``), so ``--resume`` continues mid-curriculum; stage
changes are printed and written to ``<run dir>/jsrl_stages.json``.
"""

from __future__ import annotations

import json
import os
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import numpy as np
import torch

from rlrobot.checkpoints import resolve_checkpoint
from rlrobot.domains import Domain, PositiveInt
from rlrobot.envs.vec_env import CURRICULUM, POLICY_ACTED
from rlrobot.policies.chunking import ChunkedActor
from rlrobot.policies.registry import check_compatible, policy_from_checkpoint, policy_metadata
from rlrobot.sections import Section
from rlrobot.tasks.registry import native_task_ids, task_spec

if TYPE_CHECKING:
    from rlrobot.config import TrainConfig

GUIDE_EXPERT = "expert"
VARIANTS = ("curriculum", "random")
STAGES_FILE = "jsrl_stages.json"


@dataclass
class JSRLConfig(Section):
    guide: str = ""
    """JSRL guide: '' (off) | expert (the task's scripted expert) | a run or checkpoint directory (SFT flow, offline,
    SAC or PPO policy of the same observation and action spaces), acting deterministically"""
    horizon: PositiveInt | None = None
    """H: steps the guide acts at stage 0 (None = the task's episode length)"""
    stages: PositiveInt = 10
    """curriculum stages from h = H down to h = 0"""
    tolerance: Annotated[float, Domain(0.0, 1.0, high_open=True)] = 0.1
    """advance when the moving mean of success >= best - tolerance x |best|"""
    window: PositiveInt = 64
    """finished training episodes (guide then learner) in the moving mean of success"""
    variant: Literal["curriculum", "random"] = "curriculum"
    """curriculum: h shrinks by stages; random: h ~ uniform {0, ..., H-1} per episode"""

    @property
    def enabled(self) -> bool:
        return bool(self.guide)

    def validate(self, run: TrainConfig) -> None:
        """One-line errors naming the field, no I/O."""
        if not self.enabled:
            return
        if self.variant not in VARIANTS:
            raise ValueError(f"jsrl.variant={self.variant!r} is not one of {VARIANTS}")
        for name in ("stages", "window"):
            if getattr(self, name) < 1:
                raise ValueError(f"jsrl.{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.tolerance < 1.0:
            raise ValueError(f"jsrl.tolerance must be in [0, 1), got {self.tolerance}")
        episode = run.episode_steps()
        if self.horizon is not None:
            if self.horizon < 1:
                raise ValueError(f"jsrl.horizon must be >= 1 (guide steps at stage 0), got {self.horizon}")
            if episode is not None and self.horizon > episode:
                raise ValueError(f"jsrl.horizon={self.horizon} is longer than the episode ({episode} steps)")
        elif episode is None:
            raise ValueError(f"jsrl.horizon: task {run.task!r} has no fixed episode length; give --jsrl.horizon")
        if self.guide == GUIDE_EXPERT:
            experts = [t for t in native_task_ids() if task_spec(t).has_expert]
            if run.task not in experts:
                raise ValueError(f"jsrl.guide=expert: task {run.task!r} has no scripted expert (tasks with one: "
                                 f"{', '.join(experts)}); give a guide checkpoint directory instead")

    def prepare(self, run: TrainConfig) -> None:
        """A guide checkpoint must exist (its spaces are checked against the env when the guided env is built)."""
        if not self.enabled or self.guide == GUIDE_EXPERT:
            return

        if not Path(self.guide).exists():
            raise ValueError(f"jsrl.guide={self.guide!r} is neither 'expert' nor an existing run / checkpoint directory")
        try:
            resolve_checkpoint(self.guide)
        except (FileNotFoundError, ValueError) as e:
            raise ValueError(f"jsrl.guide={self.guide!r} holds no checkpoint: {e}") from e

    def resolved_horizon(self, run: TrainConfig) -> int:
        return int(self.horizon if self.horizon is not None else run.episode_steps())

    def env_wrappers(self, run: TrainConfig) -> list:
        """The guided training env (env -> GuidedEnv), outermost: the guide acts in the task, reward wrappers apply."""
        return [lambda env: GuidedEnv(env, self, run)] if self.enabled else []


@dataclass
class JSRLInput:
    jsrl: JSRLConfig = field(default_factory=JSRLConfig)
    """Jump-Start RL: a guide rolls in for the first h steps of each training episode"""


def horizon_of_stage(horizon: int, stage: int, stages: int) -> int:
    """h_s = round(H (n - s) / n), clamped to [0, H]: H at stage 0, 0 at stage n (and after)."""
    stage = min(max(stage, 0), stages)
    return max(0, min(horizon, round(horizon * (stages - stage) / stages)))


class HorizonCurriculum:
    """The stage rule in the module docstring; ``record`` the successes of finished episodes, it returns True when the
    stage advanced."""

    def __init__(self, horizon: int, stages: int, tolerance: float, window: int):
        self.horizon, self.stages, self.tolerance, self.window = horizon, stages, tolerance, window
        self.stage = 0
        self.best: float | None = None
        self.recent: deque[float] = deque(maxlen=window)
        self.history: list[dict[str, float]] = []

    @property
    def h(self) -> int:
        return horizon_of_stage(self.horizon, self.stage, self.stages)

    @property
    def moving_mean(self) -> float | None:
        return sum(self.recent) / len(self.recent) if len(self.recent) == self.window else None

    def record(self, successes, env_steps: int = 0) -> bool:
        self.recent.extend(float(s) for s in successes)
        mean = self.moving_mean
        if mean is None or self.stage >= self.stages:
            return False
        self.best = mean if self.best is None else max(self.best, mean)
        if mean <= 0.0 or mean < self.best - self.tolerance * abs(self.best):
            return False
        self.history.append({"stage": self.stage, "h": self.h, "success": mean, "best": self.best,
                             "env_steps": env_steps})
        self.stage += 1
        self.recent.clear()  # the next stage is judged on its own episodes
        return True

    def state_arrays(self) -> dict[str, np.ndarray]:
        hist = np.array([[r["stage"], r["h"], r["success"], r["best"], r["env_steps"]] for r in self.history],
                        dtype=np.float64).reshape(-1, 5)
        return {"jsrl.stage": np.array([self.stage], np.int64),
                "jsrl.best": np.array([np.nan if self.best is None else self.best]),
                "jsrl.recent": np.array(list(self.recent), np.float64), "jsrl.history": hist}

    def load_state_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        self.stage = int(np.asarray(arrays["jsrl.stage"]).reshape(-1)[0])
        best = float(np.asarray(arrays["jsrl.best"]).reshape(-1)[0])
        self.best = None if np.isnan(best) else best
        self.recent.clear()
        self.recent.extend(float(x) for x in np.asarray(arrays["jsrl.recent"]).reshape(-1))
        self.history = [{"stage": int(r[0]), "h": int(r[1]), "success": float(r[2]), "best": float(r[3]),
                         "env_steps": int(r[4])} for r in np.asarray(arrays["jsrl.history"]).reshape(-1, 5)]


# ---------------------------------------------------------------------- guides
class ExpertGuide:
    """The task's scripted expert (its phase machine restarts with each episode, so it must act from the episode's
    first step on, which JSRL's guide-first episodes guarantee)."""

    def __init__(self, env):
        self.env = env

    def act(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.env.expert_action().clamp(-1.0, 1.0)

    def episode_done(self, done: torch.Tensor) -> None:
        return None


class PolicyGuide:
    """A trained policy from a checkpoint, deterministic; chunk policies run through per-env chunk queues."""

    def __init__(self, path: str, env, run: TrainConfig):
        self.policy, saved, ckpt = policy_from_checkpoint(path, env.device)
        try:
            check_compatible(saved, policy_metadata(run, env))
        except ValueError as e:
            raise ValueError(f"jsrl.guide={path!r}: {e}") from e
        self.policy.eval()
        self.checkpoint = ckpt
        self.chunked = ChunkedActor(self.policy, env.num_envs) if hasattr(self.policy, "sample_actions") else None

    @torch.no_grad()
    def act(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.chunked is not None:
            return self.chunked.act(obs, deterministic=True)
        return self.policy.act(obs, deterministic=True).clamp(-1.0, 1.0)

    def episode_done(self, done: torch.Tensor) -> None:
        if self.chunked is not None:
            self.chunked.episode_done(done)


def make_guide(cfg: JSRLConfig, env, run: TrainConfig):
    if cfg.guide == GUIDE_EXPERT:
        if not hasattr(env, "expert_action"):
            raise ValueError(f"jsrl.guide=expert: the {run.task!r} env has no scripted expert")
        return ExpertGuide(env)
    return PolicyGuide(cfg.guide, env, run)


# ---------------------------------------------------------------------- the guided training env
class GuidedEnv:
    """The training env with the guide acting for the first h steps of each episode (see the module docstring).
    Everything else is forwarded to the wrapped env."""

    def __init__(self, env, cfg: JSRLConfig, run: TrainConfig):
        self.env, self.cfg = env, cfg
        self.device = env.device
        n = env.num_envs
        self.horizon = cfg.resolved_horizon(run)
        self.guide = make_guide(cfg, env, run)
        self.curriculum = HorizonCurriculum(self.horizon, cfg.stages, cfg.tolerance, cfg.window) \
            if cfg.variant == "curriculum" else None
        self.generator = torch.Generator(device=self.device).manual_seed(run.seed + 7_919)
        self.t = torch.zeros(n, dtype=torch.long, device=self.device)  # step of each env's current episode
        self.h = torch.zeros(n, dtype=torch.long, device=self.device)  # guide steps of each env's current episode
        self.env_steps = 0
        self.guided_steps = 0
        self.obs: dict[str, torch.Tensor] | None = None
        self.stages_path = Path(run.run_dir()) / STAGES_FILE
        self.is_main = int(os.environ.get("RANK", "0")) == 0
        self._new_episodes(torch.ones(n, dtype=torch.bool, device=self.device))

    def __getattr__(self, name: str) -> Any:
        if name in ("get_state", "set_state"):  # only where the wrapped env has them (see the properties below)
            raise AttributeError(name)
        return getattr(self.env, name)

    # ------------------------------------------------------------------ episode bookkeeping
    @property
    def current_h(self) -> int:
        """h of the curriculum's stage (the random variant: H, the bound of its draws)."""
        return self.curriculum.h if self.curriculum is not None else self.horizon

    def _new_episodes(self, done: torch.Tensor) -> None:
        self.t = torch.where(done, torch.zeros_like(self.t), self.t)
        if self.curriculum is None:
            draw = torch.randint(0, self.horizon, self.h.shape, device=self.device, generator=self.generator)
            self.h = torch.where(done, draw, self.h)
        else:
            self.h.fill_(self.curriculum.h)  # a stage change applies at once: h only shrinks, learner steps stay

    def reset(self, seed: int | None = None):
        obs, info = self.env.reset(seed=seed)
        self._new_episodes(torch.ones_like(self.t, dtype=torch.bool))
        self.guide.episode_done(torch.ones_like(self.t, dtype=torch.bool))
        self.obs = obs
        return obs, info

    def observe(self):
        self.obs = self.env.observe()
        return self.obs

    def step(self, action: torch.Tensor):
        guided = self.t < self.h
        if bool(guided.any()):
            if self.obs is None:
                raise RuntimeError("GuidedEnv.step before reset")
            guide_action = self.guide.act(self.obs).to(action.dtype)
            action = torch.where(guided[:, None], guide_action, action)
        obs, reward, terminated, truncated, info = self.env.step(action)
        info[POLICY_ACTED] = ~guided
        done = (terminated | truncated).to(self.device)
        self.env_steps += self.env.num_envs
        self.guided_steps += int(guided.sum())
        self.t += 1
        if "episode" in info and self.curriculum is not None:
            if self.curriculum.record(info["episode"]["success"].tolist(), self.env_steps):
                self._announce()
        self.guide.episode_done(done)
        self._new_episodes(done)
        self.obs = obs
        info[CURRICULUM] = self.curriculum_metrics()
        return obs, reward, terminated, truncated, info

    def _announce(self) -> None:
        last = self.curriculum.history[-1]
        if not self.is_main:
            return
        print(f"JSRL: success {last['success']:.3f} (best {last['best']:.3f}) at h={last['h']}; stage "
              f"{self.curriculum.stage}/{self.curriculum.stages}, the guide acts for h={self.curriculum.h} steps from "
              f"now on ({self.env_steps:,} env steps of this rank)", flush=True)
        self.write_stages()

    def write_stages(self) -> None:
        if self.is_main and self.stages_path.parent.is_dir():
            self.stages_path.write_text(json.dumps(self.stats_record(), indent=2))

    def stats_record(self) -> dict[str, Any]:
        return {"variant": self.cfg.variant, "guide": self.cfg.guide, "horizon": self.horizon,
                "stage": self.curriculum.stage if self.curriculum else None, "h": self.current_h,
                "history": self.curriculum.history if self.curriculum else []}

    def curriculum_metrics(self) -> dict[str, float]:
        """For the runners' logs: h now, the stage, the share of guide steps so far, the moving mean."""
        out = {"jsrl/h": float(self.current_h),
               "jsrl/guided_fraction": self.guided_steps / max(1, self.env_steps)}
        if self.curriculum is not None:
            out["jsrl/stage"] = float(self.curriculum.stage)
            if self.curriculum.moving_mean is not None:
                out["jsrl/moving_success"] = self.curriculum.moving_mean
        return out

    # ------------------------------------------------------------------ checkpoints: the curriculum is env state
    @property
    def get_state(self):
        inner = self.env.get_state  # AttributeError (so hasattr is False) when the wrapped env has no state access

        def get_state() -> dict[str, Any]:
            state = inner()
            arrays = dict(state["arrays"])
            arrays.update({"jsrl.t": self.t.cpu().numpy(), "jsrl.h": self.h.cpu().numpy(),
                           "jsrl.counters": np.array([self.env_steps, self.guided_steps], np.int64),
                           "jsrl.generator": self.generator.get_state().numpy()})
            if self.curriculum is not None:
                arrays.update(self.curriculum.state_arrays())
            return {**state, "arrays": arrays}
        return get_state

    @property
    def set_state(self):
        inner = self.env.set_state

        def set_state(state: dict[str, Any]) -> None:
            arrays = {k: v for k, v in state["arrays"].items() if not k.startswith("jsrl.")}
            inner({**state, "arrays": arrays})
            saved = state["arrays"]
            if "jsrl.t" in saved:
                self.t = torch.as_tensor(np.asarray(saved["jsrl.t"]), dtype=torch.long, device=self.device).clone()
                self.h = torch.as_tensor(np.asarray(saved["jsrl.h"]), dtype=torch.long, device=self.device).clone()
                self.env_steps, self.guided_steps = (int(x) for x in np.asarray(saved["jsrl.counters"]))
                self.generator.set_state(torch.as_tensor(np.asarray(saved["jsrl.generator"]), dtype=torch.uint8))
                if self.curriculum is not None and "jsrl.stage" in saved:
                    self.curriculum.load_state_arrays(saved)
            self.guide.episode_done(torch.ones_like(self.t, dtype=torch.bool))  # chunk guides re-plan
        return set_state
