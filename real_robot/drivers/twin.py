"""MuJoCo digital twin of the SO-101 on its task table: the ``Robot`` interface over the simulator.

The twin is the task's own simulation (one env, joint-position control, no time limit) so that a deployed policy
meets the same physics it was trained in, through the robot-side path: joint targets in, readings out. Options make
it less ideal, like hardware: ``latency_steps`` delays commands, ``obs_noise_std`` adds noise to joint readings.
The twin advances one control period per command (``act`` or ``hold``); the chunk executor keeps the wall clock
(real time, or as fast as asked).

Two kinds of twin:

- *blind* (``setup`` given; what ``rlrobot deploy`` uses for a policy of the LeRobot profile): a reading holds
  exactly what the real arm's does, ``qpos`` / ``qvel`` / ``timestamp`` and ``images`` {camera: HxWx3 uint8 with
  the real camera's aspect and field of view, at ``frame_scale`` of its resolution (1: full size; the default 0.25
  keeps a 30 Hz tick on a CPU)}, rendered through the setup's randomisation and greenscreen (``CameraPipeline``), with
  the setup's joint-reading noise and observation delay, plus the operator's ``instruction``; never the task's
  context. The task's physics, spawn regions and actuation latency are the setup's. Success is still the
  simulator's (``success``), which a real arm has not.
- *sighted* (no setup; policies trained on the simulator's ``state``): readings also carry ``context`` (the target
  and the cube pose), which the task's state is made of. Its figures say nothing about a real arm. With
  ``policy_frames`` (a policy that reads cameras, e.g. trained on ``--obs-mode state+rgb``) its readings' ``images``
  are the task's camera observations {camera: SxSx3 uint8} exactly as training rendered them (size, camera jitter).
"""

from __future__ import annotations

import collections
import math
import time
from typing import Any

import numpy as np
import torch

import rlrobot
from rlrobot.tasks.setup import Setup, load_setup
from rlrobot.tasks.so101 import JOINT_HIGH, JOINT_LOW, JOINT_NAMES, _normalize_joint, profile_units

READING_KEYS = ("qpos", "qvel", "timestamp", "images", "instruction")
"""every key a blind twin's reading may hold: what a real arm reports, and the operator's instruction"""


class TwinRobot:
    joint_names = JOINT_NAMES
    joint_low = JOINT_LOW
    joint_high = JOINT_HIGH

    def __init__(self, task: str = "so101-reach", seed: int = 0, latency_steps: int = 0, obs_noise_std: float = 0.0,
                 cameras: bool = False, command_log: int = 10_000, setup: str | Setup | None = None,
                 frame_scale: float = 0.25, blind: bool | None = None, policy_frames: int | None = None):
        """``setup``: the scene (physics, spawn, rate; a blind twin's cameras and randomisation); ``blind``: give only
        what a real arm gives (default: when a setup is given); ``policy_frames``: (sighted twin) the size S of the
        task's camera observations to render into every reading (the policy's training frames)."""
        if isinstance(latency_steps, bool) or not isinstance(latency_steps, int) or latency_steps < 0:
            raise ValueError(f"twin latency_steps={latency_steps!r} must be an integer >= 0")
        if not (math.isfinite(obs_noise_std) and obs_noise_std >= 0):
            raise ValueError(f"twin obs_noise_std={obs_noise_std!r} must be a finite number >= 0")
        if not (math.isfinite(frame_scale) and 0 < frame_scale <= 1):
            raise ValueError(f"twin frame_scale={frame_scale!r} must be a number in (0, 1] (of the cameras' resolution)")
        self.frame_scale = frame_scale
        if policy_frames is not None and (isinstance(policy_frames, bool) or not isinstance(policy_frames, int)
                                          or policy_frames < 1):
            raise ValueError(f"twin policy_frames={policy_frames!r} must be an image size >= 1 (pixels)")
        self.policy_frames = policy_frames
        if command_log < 1:
            raise ValueError(f"twin command_log={command_log!r} must be >= 1")
        self.task, self.seed = task, seed
        self.latency_steps, self.obs_noise_std, self.cameras = latency_steps, obs_noise_std, cameras
        self.setup = None if setup is None else load_setup(setup)
        self.blind = self.setup is not None if blind is None else bool(blind)
        if self.blind and self.setup is None:
            raise ValueError("a blind twin needs a setup (its cameras and their randomisation)")
        self.pipeline = None
        self.frames = True
        """(blind twin) render the cameras into its readings; off, readings hold the joints only (a caller that needs a
        frame now and then, as rlrobot camera capture, saves the rendering of every tick)"""
        self._renderer = None
        self._history: collections.deque[dict[str, Any]] = collections.deque()
        self.env = None
        self.episode_return: float | None = None
        self.rng = np.random.default_rng(seed)
        self.episode = 0
        self.holding = False
        self.disabled = False
        self.hold_started: float | None = None
        # (monotonic time, kind, targets) of the last ``command_log`` commands, for tests: bounded for long runs
        self.commands: collections.deque[tuple[float, str, np.ndarray]] = collections.deque(maxlen=command_log)
        self._pending: collections.deque[np.ndarray] = collections.deque()

    @property
    def control_rate_hz(self) -> float:
        return 1.0 / self.env.control_dt if self.env is not None else 25.0

    def connect(self) -> None:
        options: dict[str, Any] = {"setup": self.setup} if self.setup is not None else {}
        if self.policy_frames is not None and not self.blind:
            options["image_size"] = self.policy_frames
        self.env = rlrobot.make(self.task, 1, control_mode="joint_pos", max_episode_steps=10**9, num_threads=1,
                                seed=self.seed, **options)
        if self.blind:
            from rlrobot.tasks.randomization import CameraPipeline, scene_parts

            env = self.env
            self.pipeline = CameraPipeline(self.setup, env.model, scene_parts(env.model, env.randomized_geoms), 1)
            self.units = profile_units(self.setup.use_degrees)
        self.reset_episode()

    def reset_episode(self, seed: int | None = None) -> None:
        """A new task instance (target, cube, arm start), like a human resetting the scene."""
        self.env.reset(seed=self.seed + self.episode if seed is None else seed)
        if self.pipeline is not None:  # the episode's look (lights, colours, camera jitter), from the env's draws
            self.pipeline.draw(np.array([0]), self.env.np_random)
            self._history.clear()
        self.episode += 1
        self.holding, self.disabled, self.hold_started = False, False, None
        self.episode_return = 0.0
        """the task's reward summed over this episode's control steps (acting and holding)"""
        self._last_targets = self.env.ctrl[0].copy()
        self._pending.clear()

    def observe(self) -> dict[str, Any]:
        if self.blind:
            return self._blind_reading()
        qpos = self.env.qpos[0, :6].copy()
        if self.obs_noise_std > 0:
            qpos += self.rng.normal(0.0, self.obs_noise_std, size=6)
        reading = {"qpos": qpos, "qvel": self.env.qvel[0, :6].copy(), "timestamp": time.monotonic(),
                   "context": self.env.task_context(0)}
        if self.policy_frames is not None:  # the task's own camera observations, as the policy was trained on
            frames = self.env._render_all()[0]
            reading["images"] = {cam: frames[c].copy() for c, cam in enumerate(self.env.cameras)}
        elif self.cameras:
            reading["images"] = {cam: self.env.render(0, cam) for cam in self.env.cameras}
        return reading

    def _blind_reading(self) -> dict[str, Any]:
        """What the real arm would report: noisy joints in the profile's noise (converted back to radians), frames
        of the setup's cameras at their resolution, as many readings old as the episode's observation delay; no task
        context."""
        env = self.env
        qpos = env.qpos[0, :6].copy()
        noise = self.setup.randomization.joint_noise_deg
        if noise:  # the profile's reading noise is in its own units (degrees; the gripper's 0..100)
            qpos = self.units.to_radians(self.units.to_profile(qpos) + self.rng.normal(0.0, noise, 6))
        if self.obs_noise_std:
            qpos = qpos + self.rng.normal(0.0, self.obs_noise_std, 6)
        current = {"qpos": qpos, "qvel": env.qvel[0, :6].copy()}
        if self.frames:
            if self._renderer is None:
                self._renderer = self.pipeline.make_renderer(env.model, full_scale=self.frame_scale)
            model = env.models[env.model_index[0]]
            current["images"] = {name: self.pipeline.render_full(self._renderer, 0, c, model, env.datas[0],
                                                                 env.image_rng, self.frame_scale)
                                 for c, name in enumerate(self.pipeline.names)}
        self._history.appendleft(current)
        delay = int(env.observation_delay[0])
        while len(self._history) > delay + 1:
            self._history.pop()
        return {**self._history[-1], "timestamp": time.monotonic(), "instruction": env.instruction[0]}

    def _step(self, targets: np.ndarray, kind: str) -> None:
        if self.disabled:
            raise RuntimeError("the twin is disabled (e-stop or watchdog); reset_episode() to re-enable it")
        self.commands.append((time.monotonic(), kind, targets.copy()))
        self._pending.append(targets.copy())
        applied = self._pending.popleft() if len(self._pending) > self.latency_steps else self._last_targets
        self._last_targets = applied
        action = torch.from_numpy(_normalize_joint(applied).astype(np.float32)[None])
        reward = self.env.step(action.clamp(-1.0, 1.0))[1]
        self.episode_return += float(reward[0])

    def act(self, joint_targets: np.ndarray) -> None:
        targets = np.asarray(joint_targets, np.float64)
        if targets.shape != (6,) or not np.isfinite(targets).all():
            raise ValueError(f"joint_targets must be 6 finite radians, got {targets}")
        self.holding, self.hold_started = False, None
        self._step(targets, "act")

    def hold(self, at: np.ndarray | None = None) -> None:
        if not self.holding:
            self.holding, self.hold_started = True, time.monotonic()
        if at is None:
            raise ValueError("hold needs the supervisor's command; without one, disable the arm")
        targets = np.asarray(at, np.float64)
        if targets.shape != (6,) or not np.isfinite(targets).all():
            raise ValueError(f"hold targets must be 6 finite radians, got {targets}")
        self._step(targets, "hold")

    def disable(self) -> None:
        self.disabled = True
        self.commands.append((time.monotonic(), "disable", self.env.qpos[0, :6].copy()))

    def success(self) -> bool:
        return bool(self.env.success_now()[0])

    def disconnect(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
        if self.env is not None:
            self.env.close()
            self.env = None
