"""gymnasium's MuJoCo locomotion tasks (v5) on the native batched backend: HalfCheetah, Hopper, Walker2d, Ant.

Task ids: ``mujoco-HalfCheetah-v5``, ``mujoco-Hopper-v5``, ``mujoco-Walker2d-v5``, ``mujoco-Ant-v5`` (the ``gym:`` ids
run gymnasium's own single-threaded envs through the adapter; these run all envs in ``MujocoVecEnv``'s thread pool).

Same definitions as gymnasium 1.x's ``*_v5.py`` with their default arguments, on gymnasium's own XML files (read from
the installed gymnasium package, so the model is byte-for-byte the one gymnasium steps):
- physics: ``ctrl = action``, ``mj_step(model, data, nstep=frame_skip)`` (5 for HalfCheetah and Ant, 4 for Hopper and
  Walker2d), and for Ant ``mj_rnePostConstraint`` after it (gymnasium calls it after every step; only Ant reads its
  output, ``cfrc_ext``). Positions for the forward velocity are read exactly where gymnasium reads them (``qpos[0]``,
  Ant: ``xpos`` of the torso as left by ``mj_step``, i.e. from the start of its last substep).
- observation, reward, termination: gymnasium's formulas, batched in float64 numpy; observations are handed out as
  float32 (the VecEnv contract), rewards as float32.
- reset: ``mj_resetData``, then ``qpos = qpos0 + U(-s, s)`` and ``qvel = N(0, 1) * s`` (HalfCheetah, Ant) or
  ``U(-s, s)`` (Hopper, Walker2d), then ``mj_forward``: the same distribution; with one env and the same seed the same
  draws as gymnasium (one generator, qpos noise then qvel noise), so one env reproduces ``gymnasium.make`` exactly,
  autoresets included (``tests/tasks/test_locomotion.py``).
- episodes end at 1,000 steps (truncated) or when unhealthy (terminated; Hopper, Walker2d, Ant).

Differences, all from the VecEnv contract: actions are clipped to the action space [-1, 1] before use (gymnasium
passes an out-of-range action on and charges its control cost; CleanRL and SB3 clip it too); ``truncated`` is False
on a step that also terminates (gymnasium's TimeLimit reports both); the episode ends when MuJoCo flags a diverged
simulation (``mjWARN_BADQACC``).
"""

from __future__ import annotations

import re
from pathlib import Path

import gymnasium
import mujoco
import numpy as np

from rlrobot.tasks.registry import TaskSpec, register_task

from .mujoco_vec_env import MujocoVecEnv, PhysicsRandomization

GYM_ASSETS = Path(gymnasium.__file__).parent / "envs" / "mujoco" / "assets"


class LocomotionEnv(MujocoVecEnv):
    """Shared stepping, reset noise and observation of the four tasks; subclasses set the constants and the rules."""

    gym_id: str
    xml_file: str
    task_frame_skip: int
    reset_noise_scale: float
    ctrl_cost_weight: float
    qvel_noise: str  # "normal" (HalfCheetah, Ant) or "uniform" (Hopper, Walker2d), as in gymnasium
    forward_reward_weight = 1.0
    healthy_reward = 1.0
    qpos_skip = 1  # x (and Ant's y) are left out of the observation
    qvel_clip: float | None = None
    rne_post_constraint = False
    default_max_episode_steps = 1000
    description = "run forward"

    def __init__(self, num_envs: int, *, max_episode_steps: int | None = None, obs_mode: str = "state",
                 reward_mode: str = "dense", control_mode: str = "joint_torque", terminate_when_unhealthy: bool = True,
                 **kw):
        if getattr(self, "backend", "mujoco") != "mujoco":  # the stepping and gather above are the native backend's
            raise ValueError(f"task {self.task_id} runs on backend 'mujoco' only, not {self.backend!r}")
        if control_mode != "joint_torque":
            raise ValueError(f"control_mode={control_mode!r} is not one of ('joint_torque',) (task {self.task_id})")
        if obs_mode != "state":
            raise ValueError(f"obs_mode={obs_mode!r} is not one of ('state',) (task {self.task_id})")
        if reward_mode != "dense":
            raise ValueError(f"reward_mode={reward_mode!r} is not one of ('dense',) (task {self.task_id})")
        for name in ("frame_skip", "cameras", "camera_jitter", "physics_randomization"):
            if name in kw:
                raise ValueError(f"{name} is fixed by the gymnasium v5 definition of {self.task_id}; it cannot be set")
        self.xml_path = str(GYM_ASSETS / self.xml_file)
        self.terminate_when_unhealthy = terminate_when_unhealthy
        super().__init__(num_envs, frame_skip=self.task_frame_skip,
                         max_episode_steps=max_episode_steps or self.default_max_episode_steps,
                         cameras=("track",), camera_jitter=0.0,
                         physics_randomization=PhysicsRandomization(enabled=False), **kw)
        m = self.model
        if m.nu != self.action_dim:
            raise RuntimeError(f"{self.xml_path} has {m.nu} actuators, expected {self.action_dim}")
        self.dt = self.control_dt
        self._action = np.zeros((num_envs, m.nu))
        self._pos_before = np.zeros((num_envs, 2))
        self.cfrc_ext = np.zeros((num_envs, m.nbody, 6))
        self._views["cfrc_ext"] = [d.cfrc_ext for d in self.datas]
        self._views["torso_xpos"] = [d.xpos[1] for d in self.datas]
        self.torso_xy = np.zeros((num_envs, 3))

    def _load_model(self) -> mujoco.MjModel:
        """The gymnasium model, with a compiler ``settotalmass`` (deprecated in MuJoCo 4, a warning on every load) applied
        through ``mj_setTotalmass`` + ``mj_setConst`` instead: the same masses, inertias and constants, bit for bit."""
        xml = Path(self.xml_path).read_text()
        total = re.search(r'settotalmass="([^"]+)"', xml)
        if total is None:
            return super()._load_model()
        model = mujoco.MjModel.from_xml_string(xml.replace(total.group(0), ""))
        mujoco.mj_setTotalmass(model, float(total.group(1)))
        mujoco.mj_setConst(model, mujoco.MjData(model))
        self._configure_model(model)
        return model

    @property
    def task_id(self) -> str:
        return f"mujoco-{self.gym_id}"

    @property
    def instruction(self) -> list[str]:
        return [self.description] * self.num_envs

    # ---------------------------------------------------------------- physics (worker threads: C calls only)
    def _step_one(self, i: int) -> None:
        m, d = self.model, self.datas[i]
        self._views["ctrl"][i][:] = self.ctrl[i]
        mujoco.mj_step(m, d, self.frame_skip)
        if self.rne_post_constraint:
            mujoco.mj_rnePostConstraint(m, d)

    def _after_host_reset(self, ids: np.ndarray) -> None:
        for i in ids:  # gymnasium's set_state: mj_forward only
            mujoco.mj_forward(self.model, self.datas[i])

    def _gather_all(self) -> None:
        g = self._gather
        g("qpos", self.qpos)
        g("qvel", self.qvel)
        if self.rne_post_constraint:
            g("cfrc_ext", self.cfrc_ext)
            g("torso_xpos", self.torso_xy)

    # ---------------------------------------------------------------- task hooks
    def _position(self) -> np.ndarray:
        """(x, y) that the forward velocity differentiates (gymnasium: qpos[0]; Ant: the torso's xpos)."""
        return np.stack([self.qpos[:, 0], np.zeros(self.num_envs)], axis=1)

    def _actions_to_ctrl(self, action: np.ndarray) -> np.ndarray:
        self._action = action
        self._pos_before = self._position().copy()  # before the physics step, as gymnasium reads it
        return action

    def _reset_envs(self, env_ids: np.ndarray) -> None:
        m, s, rng = self.model, self.reset_noise_scale, self.np_random
        n = len(env_ids)
        qpos = m.qpos0 + rng.uniform(low=-s, high=s, size=(n, m.nq))
        if self.qvel_noise == "normal":
            qvel = s * rng.standard_normal((n, m.nv))
        else:
            qvel = rng.uniform(low=-s, high=s, size=(n, m.nv))
        for k, i in enumerate(env_ids):
            self.datas[i].qpos[:] = qpos[k]
            self.datas[i].qvel[:] = qvel[k]

    def _state_obs(self) -> np.ndarray:
        qvel = self.qvel if self.qvel_clip is None else np.clip(self.qvel, -self.qvel_clip, self.qvel_clip)
        return np.concatenate([self.qpos[:, self.qpos_skip:], qvel], axis=1)

    def _healthy(self) -> np.ndarray:
        return np.ones(self.num_envs, dtype=bool)

    def _costs(self) -> np.ndarray:
        return self.ctrl_cost_weight * np.sum(np.square(self._action), axis=1)

    def _evaluate(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        x_velocity = (self._position()[:, 0] - self._pos_before[:, 0]) / self.dt
        healthy = self._healthy()
        reward = self.forward_reward_weight * x_velocity + self._survive_reward(healthy) - self._costs()
        terminated = ~healthy if self.terminate_when_unhealthy else np.zeros(self.num_envs, dtype=bool)
        return reward, np.zeros(self.num_envs, dtype=bool), terminated

    def _survive_reward(self, healthy: np.ndarray) -> np.ndarray | float:
        return 0.0

    def render(self, env_index: int = 0, camera: str = "track") -> np.ndarray:
        return super().render(env_index, camera)


class _HealthyRewardMixin:
    def _survive_reward(self, healthy: np.ndarray) -> np.ndarray:
        return healthy * self.healthy_reward


class HalfCheetahEnv(LocomotionEnv):
    gym_id, xml_file, task_frame_skip = "HalfCheetah-v5", "half_cheetah.xml", 5
    reset_noise_scale, ctrl_cost_weight, qvel_noise = 0.1, 0.1, "normal"
    action_dim, state_dim = 6, 17


class HopperEnv(_HealthyRewardMixin, LocomotionEnv):
    gym_id, xml_file, task_frame_skip = "Hopper-v5", "hopper.xml", 4
    reset_noise_scale, ctrl_cost_weight, qvel_noise = 5e-3, 1e-3, "uniform"
    action_dim, state_dim = 3, 11
    qvel_clip = 10.0
    healthy_state_range, healthy_z_range, healthy_angle_range = (-100.0, 100.0), (0.7, float("inf")), (-0.2, 0.2)

    def _healthy(self) -> np.ndarray:
        z, angle = self.qpos[:, 1], self.qpos[:, 2]
        state = np.concatenate([self.qpos[:, 2:], self.qvel], axis=1)  # gymnasium: state_vector()[2:]
        lo, hi = self.healthy_state_range
        return (np.all((lo < state) & (state < hi), axis=1) & (self.healthy_z_range[0] < z) & (z < self.healthy_z_range[1])
                & (self.healthy_angle_range[0] < angle) & (angle < self.healthy_angle_range[1]))


class Walker2dEnv(_HealthyRewardMixin, LocomotionEnv):
    gym_id, xml_file, task_frame_skip = "Walker2d-v5", "walker2d_v5.xml", 4
    reset_noise_scale, ctrl_cost_weight, qvel_noise = 5e-3, 1e-3, "uniform"
    action_dim, state_dim = 6, 17
    qvel_clip = 10.0
    healthy_z_range, healthy_angle_range = (0.8, 2.0), (-1.0, 1.0)

    def _healthy(self) -> np.ndarray:
        z, angle = self.qpos[:, 1], self.qpos[:, 2]
        return ((self.healthy_z_range[0] < z) & (z < self.healthy_z_range[1])
                & (self.healthy_angle_range[0] < angle) & (angle < self.healthy_angle_range[1]))


class AntEnv(_HealthyRewardMixin, LocomotionEnv):
    gym_id, xml_file, task_frame_skip = "Ant-v5", "ant.xml", 5
    reset_noise_scale, ctrl_cost_weight, qvel_noise = 0.1, 0.5, "normal"
    action_dim, state_dim = 8, 105  # qpos[2:] 13 + qvel 14 + cfrc_ext[1:] 13 x 6
    qpos_skip = 2
    rne_post_constraint = True
    contact_cost_weight, contact_force_range, healthy_z_range = 5e-4, (-1.0, 1.0), (0.2, 1.0)

    def _position(self) -> np.ndarray:
        return self.torso_xy[:, :2]

    def _contact_forces(self) -> np.ndarray:
        return np.clip(self.cfrc_ext, *self.contact_force_range)

    def _state_obs(self) -> np.ndarray:
        forces = self._contact_forces()[:, 1:].reshape(self.num_envs, -1)
        return np.concatenate([self.qpos[:, self.qpos_skip:], self.qvel, forces], axis=1)

    def _costs(self) -> np.ndarray:
        contact = self.contact_cost_weight * np.sum(np.square(self._contact_forces()).reshape(self.num_envs, -1), axis=1)
        return super()._costs() + contact

    def _healthy(self) -> np.ndarray:
        finite = np.isfinite(self.qpos).all(axis=1) & np.isfinite(self.qvel).all(axis=1)
        z = self.qpos[:, 2]
        return finite & (self.healthy_z_range[0] <= z) & (z <= self.healthy_z_range[1])


LOCOMOTION_TASKS = (HalfCheetahEnv, HopperEnv, Walker2dEnv, AntEnv)

for _cls in LOCOMOTION_TASKS:
    register_task(TaskSpec(id=f"mujoco-{_cls.gym_id}", entry_point=_cls, obs_modes=("state",), reward_modes=("dense",),
                           control_modes=("joint_torque",), default_max_episode_steps=1000, has_expert=False))
