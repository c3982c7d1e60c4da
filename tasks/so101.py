"""SO-101 tasks on the native MuJoCo backend: reach, push (cube to target), lift (grasp and lift the cube 5 cm).

Everything here is batched numpy over all envs: control-mode mapping (joint targets, joint deltas, Cartesian deltas
through damped-least-squares IK), observations, rewards, success, and the IK-based scripted experts that make
demonstrations without any download.
"""

from __future__ import annotations

from pathlib import Path

import gymnasium
import numpy as np
import torch

from rlrobot.tasks.registry import TaskSpec, register_task
from rlrobot.tasks.servo_limits import STS3215_MAX_ACCELERATION, STS3215_MAX_VELOCITY, step_window

from .mujoco_vec_env import OBS_MODES, REWARD_MODES, MujocoVecEnv
from .profile import PRIVILEGED_KEY, PROFILE_OBS_MODE, ProfileUnits, image_key
from .setup import Setup, load_setup

ASSETS = Path(__file__).parent / "assets"
CONTROL_MODES = ("joint_pos", "joint_delta", "ee_delta")
SO101_OBS_MODES = (*OBS_MODES, PROFILE_OBS_MODE)
"""state | rgb | state+rgb | lerobot (the LeRobot SO-101 profile, tasks/profile.py)"""
JOINT_NAMES = ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper")
JOINT_LOW = np.array([-1.91986, -1.74533, -1.69, -1.65806, -2.74385, -0.174533])
JOINT_HIGH = np.array([1.91986, 1.74533, 1.69, 1.65806, 2.84121, 1.74533])
# Gripper pointing straight down with the TCP at about (0.17, 0, 0.09): found once with the IK below.
HOME_QPOS = np.array([0.0, 0.31, -0.262, 1.523, 0.0, 0.6])
CUBE_HALF = 0.015
PUSHER_HALF_WIDTH = 0.021  # jaws held at the grasp angle form a 4.2 cm wide U around the pusher site
PUSH_GRIPPER_ACTION = -0.3  # gripper at ~0.5 rad: the moving pad parallel to the fixed jaw
DOWN = np.array([0.0, 0.0, -1.0])

MAX_JOINT_DELTA = 0.08  # rad per control step in joint_delta mode (2 rad/s at 25 Hz)
MAX_EE_DELTA = 0.02  # m per control step in ee_delta mode (0.5 m/s at 25 Hz)
MAX_ROLL_DELTA = 0.15  # rad per control step for the wrist roll in ee_delta mode
IK_DAMPING = 0.03
# Floor of Cartesian commands (like LeRobot's end-effector bounds): a move never takes the lower jaw tip below this
# height above the table. Without it a policy holding "down" drove the jaws into the table with 10-35 N, and the
# friction of that contact jammed the arm sideways (11 of the 13 failed eval episodes of SAC on so101-push). A floor
# on the TCP alone is not enough: the closed jaws reach 8 mm lower than the open ones.
JAW_TIP_FLOOR = 0.004
IK_POINTING_WEIGHT = 0.1  # metres of TCP error that weigh like one radian of pointing error


MODEL_TIMESTEP = 0.004  # s: the MJCF's; a setup's control rate keeps the physics step within a few percent of it
START_NOISE = 0.05  # rad: each episode's start pose is HOME_QPOS + U(-START_NOISE, START_NOISE) (the gripper exact)


def profile_units(use_degrees: bool = True) -> ProfileUnits:
    """The LeRobot SO-101 units of this arm model (its joint ranges as the calibrated ranges)."""
    return ProfileUnits(tuple(JOINT_LOW), tuple(JOINT_HIGH), use_degrees)


def start_pose_box() -> tuple[np.ndarray, np.ndarray]:
    """(low, high) joint positions (rad) of the episodes' start poses: what a policy was trained to start from."""
    noise = np.full(6, START_NOISE)
    noise[5] = 0.0
    return HOME_QPOS - noise, HOME_QPOS + noise


def control_timing(rate_hz: float) -> tuple[int, float]:
    """(frame_skip, physics timestep) of a control rate: the whole number of physics steps per control step that
    keeps the timestep nearest the model's 4 ms (30 Hz: 8 steps of 4.17 ms; 25 Hz: 10 of 4 ms)."""
    frame_skip = max(1, round(1.0 / (rate_hz * MODEL_TIMESTEP)))
    return frame_skip, 1.0 / (rate_hz * frame_skip)


def _normalize_joint(q: np.ndarray) -> np.ndarray:
    return 2.0 * (q - JOINT_LOW) / (JOINT_HIGH - JOINT_LOW) - 1.0


def _denormalize_joint(a: np.ndarray) -> np.ndarray:
    return JOINT_LOW + (a + 1.0) * 0.5 * (JOINT_HIGH - JOINT_LOW)


def _gripper_from_action(a: np.ndarray) -> np.ndarray:
    return JOINT_LOW[5] + (a + 1.0) * 0.5 * (JOINT_HIGH[5] - JOINT_LOW[5])


def _wrap(x: np.ndarray, period: float) -> np.ndarray:
    return (x + period / 2) % period - period / 2


def push_contact_pose(cube: np.ndarray, target: np.ndarray, pusher: np.ndarray, fallback_direction: np.ndarray
                      ) -> np.ndarray:
    """[N, 3] pose of the pusher against the cube's face away from the target (the push rewards' reach term; why it
    is shaped so: ``SO101Push._contact_pose``). Shared with the push families of ``tasks/so101_suite.py``."""
    to_target = target[:, :2] - cube[:, :2]
    norm = np.linalg.norm(to_target, axis=1, keepdims=True)
    direction = np.where(norm > 1e-3, to_target / np.maximum(norm, 1e-9), fallback_direction)
    along = np.sum((pusher[:, :2] - cube[:, :2]) * direction, axis=1)
    behind = np.clip((-along - CUBE_HALF) / 0.01, 0.0, 1.0)  # 1 from 1 cm behind the cube's near face on
    pose = cube.copy()
    pose[:, :2] -= direction * (CUBE_HALF + PUSHER_HALF_WIDTH)
    pose[:, 2] = 0.022 + 0.04 * (1.0 - behind)
    return pose


class SO101Env(MujocoVecEnv):
    """Shared arm, control modes and IK for the SO-101 tasks."""

    xml_path = str(ASSETS / "so101_scene.xml")
    tracked_sites = ("tcp", "pusher", "fixed_jaw_tip", "moving_jaw_tip")
    tracked_bodies = ("cube",)
    jacobian_site = "tcp"
    randomized_geoms = ("cube",)
    randomized_bodies = ("cube",)
    contact_sensors = ("fixed_jaw_cube", "moving_jaw_cube")
    sized_geoms: tuple[str, ...] = ("cube",)
    """geoms whose size a setup's physics.object_size scales (and that are placed on the table by their size)"""
    marker_geoms: tuple[str, ...] = ("target",)
    state_context: tuple[str, ...] | None = None
    """what the ``state`` of obs_mode state needs beyond the arm's readings, from a robot's ``context`` (the user or a
    perception module): None when it holds simulator facts no robot reports (contacts, every object's pose), which
    makes ``state`` privileged on a real arm"""
    task_name = "so101"
    default_max_episode_steps = 100
    obs_modes = SO101_OBS_MODES

    def __init__(self, num_envs: int, *, control_mode: str = "ee_delta", max_episode_steps: int | None = None,
                 contact_solref: float | None = None, jaw_solref: float | None = None,
                 jaw_tip_floor: float | None = JAW_TIP_FLOOR, servo_limits: bool = False,
                 setup: str | Setup | dict | None = None, **kw):
        """``contact_solref`` / ``jaw_solref`` / ``jaw_tip_floor``: contact studies (``rlrobot results``); the defaults
        are the task as published. ``setup``: a setup file (path, inline JSON or ``Setup``; ``tasks/setup.py``): its
        control rate, table placement, spawn regions and physics randomisation apply in every obs mode; its cameras and
        visual randomisation make the images of ``obs_mode="lerobot"`` (the LeRobot SO-101 profile,
        ``tasks/profile.py``), which uses the shipped default setup when none is given and always keeps the servo limits
        on (the real arm's supervisor holds the commands to them). ``contact_solref``: the time constant of every
        collision geom (None: the MJCF's 0.03; the scene had 0.005 before the contact fix). ``jaw_solref``: the jaws'
        own time constant, mixed in with a dominant ``solmix`` so that it sets the jaw/cube (and jaw/table) contacts
        while cube/table keeps ``contact_solref``. ``jaw_tip_floor``: the Cartesian floor of ``ee_delta`` moves in
        metres above the table (None: no floor, as before 2026-12-03). ``servo_limits``: hold the joint targets to the
        velocity and acceleration limits of the SO-101's STS3215 servos, through the deploy safety supervisor's own
        window (its defaults), so a policy trained with it is not clamped by the supervisor on the arm (without it the
        IK may move a joint 0.2 rad per step, over twice the servo's speed)."""
        if control_mode not in CONTROL_MODES:
            raise ValueError(f"control_mode={control_mode!r} is not one of {CONTROL_MODES}")
        for name, value in (("contact_solref", contact_solref), ("jaw_solref", jaw_solref)):
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0 seconds or None, got {value}")
        if jaw_tip_floor is not None and not jaw_tip_floor >= 0:
            raise ValueError(f"jaw_tip_floor must be >= 0 metres or None (no floor), got {jaw_tip_floor}")
        self.contact_solref, self.jaw_solref, self.jaw_tip_floor = contact_solref, jaw_solref, jaw_tip_floor
        obs_mode = kw.get("obs_mode", "state")
        self.profile = obs_mode == PROFILE_OBS_MODE
        self.setup: Setup | None = load_setup(setup) if (setup not in (None, "") or self.profile) else None
        if self.setup is not None:
            kw["frame_skip"], self._timestep = control_timing(self.setup.control_rate_hz)
            self.units = profile_units(self.setup.use_degrees)
        else:
            self.units = profile_units()
        servo_limits = servo_limits or self.profile
        self.servo_limits = servo_limits
        self._prev_ctrl = np.zeros((num_envs, 6))  # the targets before the current ones (the acceleration limit's)
        self.control_mode = control_mode
        self.action_dim = 5 if control_mode == "ee_delta" else 6
        self.target = np.zeros((num_envs, 3))
        self.cube_start = np.zeros((num_envs, 3))
        self._expert_phase = np.zeros(num_envs, dtype=np.int64)
        self._expert_timer = np.zeros(num_envs, dtype=np.int64)
        self._ticks = 0  # control steps taken (the profile's observation delay shifts its history once a step)
        self._fresh = np.zeros(num_envs, bool)  # envs reset since the last observation
        self.actuation_latency = np.zeros(num_envs, np.int64)
        self.observation_delay = np.zeros(num_envs, np.int64)
        super().__init__(num_envs, max_episode_steps=max_episode_steps or self.default_max_episode_steps, **kw)
        self._mocap_id = self.model.body("target").mocapid[0]
        self._sized_geom_ids = tuple(self.model.geom(g).id for g in self.sized_geoms)
        if self.setup is not None:
            self._init_setup()

    def _configure_model(self, model) -> None:
        """The setup's control rate (physics timestep) and table placement on every copy of the model."""
        if self.setup is None:
            return
        model.opt.timestep = self._timestep
        base = self.setup.robot
        yaw = np.radians(base.base_yaw_deg)
        # the table in the robot base frame: p_world = R(yaw)^T (p_table - base_on_table)
        rot = np.array([[np.cos(yaw), np.sin(yaw)], [-np.sin(yaw), np.cos(yaw)]])
        table = model.geom("table").id
        model.geom_pos[table, :2] = rot @ -np.asarray(base.base_on_table)
        model.geom_quat[table] = (np.cos(-yaw / 2), 0.0, 0.0, np.sin(-yaw / 2))
        model.geom_size[table, :2] = np.asarray(self.setup.table.size) / 2
        model.geom_rbound[table] = float(np.linalg.norm(model.geom_size[table]))
        model.geom_aabb[table, 3:] = model.geom_size[table]

    def _build_model_bank(self) -> None:
        if self.setup is None:
            super()._build_model_bank()
        else:  # the setup's ranges, drawn once: the bank is part of the task definition, not of the run's seed
            from .randomization import randomize_physics

            ranges = self.setup.randomization.physics
            rng = np.random.default_rng(12345)
            m = self.model
            objects = tuple(m.geom(g).id for g in self.randomized_geoms)
            bodies = tuple(m.body(b).id for b in self.randomized_bodies)
            sized = tuple(m.geom(g).id for g in self.sized_geoms)
            arm = tuple(int(m.joint(j).dofadr[0]) for j in JOINT_NAMES)
            self.models = [self.model]
            for _ in range(ranges.bank_size - 1):
                copy = self._load_model()
                randomize_physics(copy, rng, ranges, objects, bodies, sized, arm)
                self.models.append(copy)
        for m in self.models:  # contact-study options; untouched (the MJCF's values) by default
            collide = np.flatnonzero(m.geom_contype > 0)
            if self.contact_solref is not None:
                m.geom_solref[collide, 0] = self.contact_solref
            if self.jaw_solref is not None:
                for jaw in ("fixed_jaw", "moving_jaw"):
                    m.geom(jaw).solref[0] = self.jaw_solref
                    m.geom(jaw).solmix[0] = 1e4  # mixing weight vs the cube's 1: the jaw's time constant wins

    # ------------------------------------------------------------ the setup and the LeRobot profile
    def _init_setup(self) -> None:
        """Latency and delay buffers, the profile's cameras and its observation space."""
        if getattr(self, "backend", "mujoco") != "mujoco":  # its batched physics knows neither latency nor the cameras
            raise ValueError(f"setup (and obs_mode={PROFILE_OBS_MODE!r}) runs on the native backend 'mujoco', not "
                             f"{self.backend!r}")
        physics = self.setup.randomization.physics
        n = self.num_envs
        self._max_latency = int(physics.actuation_latency_steps[1])
        self._max_delay = int(physics.observation_delay_steps[1])
        if self._max_latency:
            self._ctrl_history = np.repeat(self.ctrl[:, None, :], self._max_latency + 1, axis=1)
            self.applied_ctrl = self.ctrl.copy()
        if not self.profile:
            return
        from .randomization import CameraPipeline, scene_parts

        self.camera_pipeline = CameraPipeline(self.setup, self.model, scene_parts(self.model, self.randomized_geoms), n)
        self.profile_cameras = self.setup.camera_names
        size = self.setup.image_size
        spaces = {"state": gymnasium.spaces.Box(-np.inf, np.inf, (len(JOINT_NAMES),), np.float32)}
        for cam in self.profile_cameras:
            spaces[image_key(cam)] = gymnasium.spaces.Box(0, 255, (3, size, size), np.uint8)
        spaces[PRIVILEGED_KEY] = gymnasium.spaces.Box(-np.inf, np.inf, (self.state_dim,), np.float32)
        self.single_observation_space = gymnasium.spaces.Dict(spaces)
        self._frames = np.zeros((n, len(self.profile_cameras), size, size, 3), np.uint8)
        self._state_history = np.zeros((n, self._max_delay + 1, len(JOINT_NAMES)))
        self._frame_history = np.zeros((n, self._max_delay + 1, *self._frames.shape[1:]), np.uint8)
        self._observed_tick = -1

    def _before_physics(self) -> None:
        self._ticks += 1
        if self.setup is not None and self._max_latency:  # commands reach the servos actuation_latency steps late
            self._ctrl_history[:, 1:] = self._ctrl_history[:, :-1]
            self._ctrl_history[:, 0] = self.ctrl
            self.applied_ctrl[:] = self._ctrl_history[np.arange(self.num_envs), self.actuation_latency]

    def _observe(self):
        if not self.profile:
            return super()._observe()
        return self._profile_observation()

    def _profile_observation(self) -> dict[str, torch.Tensor]:
        """``state`` (the six readings in LeRobot's units, with the setup's reading noise), ``image_<camera>`` (the
        setup's cameras through the randomisation, greenscreen and ``prepare_frames``), both as old as each env's
        observation delay, and ``privileged_state`` (the task's full state, for critics and teachers)."""
        fresh = self._fresh.copy()
        new_tick = self._observed_tick != self._ticks
        # a second observation in one step (after an autoreset) renders only the envs that were reset
        ids = np.arange(self.num_envs) if new_tick else np.flatnonzero(fresh)
        if len(ids):
            self._frames[ids] = self.render_setup_cameras(ids)
        state = self.units.to_profile(self.qpos[:, :6])
        noise = self.setup.randomization.joint_noise_deg
        if noise:
            state = state + self.image_rng.normal(0.0, noise, state.shape)
        if new_tick:
            self._state_history[:, 1:] = self._state_history[:, :-1]
            self._frame_history[:, 1:] = self._frame_history[:, :-1]
            self._state_history[:, 0], self._frame_history[:, 0] = state, self._frames
        self._state_history[fresh] = state[fresh, None]
        self._frame_history[fresh] = self._frames[fresh, None]
        self._observed_tick = self._ticks
        self._fresh[:] = False
        rows = np.arange(self.num_envs)
        delayed_state = self._state_history[rows, self.observation_delay]
        delayed_frames = self._frame_history[rows, self.observation_delay]
        t = self._to_tensor
        obs = {"state": t(delayed_state.astype(np.float32))}
        for c, cam in enumerate(self.profile_cameras):
            obs[image_key(cam)] = t(delayed_frames[:, c]).permute(0, 3, 1, 2)
        obs[PRIVILEGED_KEY] = t(self._state_obs().astype(np.float32))
        return obs

    # ------------------------------------------------------------ views of the gathered buffers
    @property
    def tcp(self) -> np.ndarray:
        return self.site_pos[:, 0]

    @property
    def pusher(self) -> np.ndarray:
        return self.site_pos[:, 1]

    @property
    def jaw_tips(self) -> np.ndarray:
        """[N, 2, 3]: centres of the fixed and the moving jaw's end faces."""
        return self.site_pos[:, 2:4]

    @property
    def tcp_axes(self) -> np.ndarray:
        """[N, 3, 3] rotation of the TCP frame; column 0 is the approach axis, column 1 the jaw-closing axis."""
        return self.site_mat[:, 0].reshape(-1, 3, 3)

    @property
    def cube_pos(self) -> np.ndarray:
        return self.body_pos[:, 0]

    @property
    def cube_yaw(self) -> np.ndarray:
        w, x, y, z = self.body_quat[:, 0].T
        return np.arctan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))

    # ------------------------------------------------------------ control
    def _ik_targets(self, dpos: np.ndarray, droll: np.ndarray, gripper: np.ndarray) -> np.ndarray:
        """Joint targets that move the TCP by ``dpos`` keeping the gripper pointing down (batched DLS IK); the move
        stops the jaw tips at the floor above the table."""
        dpos = dpos.copy()
        if self.jaw_tip_floor is not None:
            dpos[:, 2] = np.maximum(dpos[:, 2], self.jaw_tip_floor - self.jaw_tips[:, :, 2].min(1))
        approach = self.tcp_axes[:, :, 0]
        project = np.eye(3) - approach[:, :, None] * approach[:, None, :]  # ignore rotation about the approach axis
        jac = np.concatenate(
            [self.jacp[:, :, :4], IK_POINTING_WEIGHT * (project @ self.jacr[:, :, :4])], axis=1
        )  # [N, 6, 4]: pan, lift, elbow, wrist_flex
        err = np.concatenate([dpos, IK_POINTING_WEIGHT * np.cross(approach, DOWN)], axis=1)
        jt = jac.transpose(0, 2, 1)
        lhs = jt @ jac + IK_DAMPING**2 * np.eye(4)
        dq = np.linalg.solve(lhs, (jt @ err[:, :, None]))[:, :, 0].clip(-0.2, 0.2)
        q = np.empty((self.num_envs, 6))
        q[:, :4] = self.qpos[:, :4] + dq
        q[:, 4] = self.qpos[:, 4] + droll
        q[:, 5] = gripper
        return q.clip(JOINT_LOW, JOINT_HIGH)

    def _actions_to_ctrl(self, action: np.ndarray) -> np.ndarray:
        if self.control_mode == "joint_pos":
            return _denormalize_joint(action)
        if self.control_mode == "joint_delta":
            q = self.ctrl.copy()
            q[:, :5] += action[:, :5] * MAX_JOINT_DELTA
            q[:, 5] = _gripper_from_action(action[:, 5])
            return q.clip(JOINT_LOW, JOINT_HIGH)
        return self._ik_targets(action[:, :3] * MAX_EE_DELTA, action[:, 3] * MAX_ROLL_DELTA, _gripper_from_action(action[:, 4]))

    def _limit_ctrl(self, ctrl: np.ndarray) -> np.ndarray:
        if not self.servo_limits:
            return ctrl
        dt = self.control_dt  # the supervisor's defaults: the STS3215 servos' limits
        lo, hi = step_window(self.ctrl, self._prev_ctrl, STS3215_MAX_VELOCITY * dt, STS3215_MAX_ACCELERATION * dt**2,
                             JOINT_LOW, JOINT_HIGH)
        limited = self.ctrl + (ctrl.clip(JOINT_LOW, JOINT_HIGH) - self.ctrl).clip(lo, hi)
        self._prev_ctrl[:] = self.ctrl
        return limited

    def cartesian_action(self, dpos: np.ndarray, droll: np.ndarray, gripper_action: np.ndarray) -> np.ndarray:
        """Express a Cartesian command (metres, radians, gripper in [-1, 1]) in this env's control mode."""
        ee = np.concatenate(
            [(dpos / MAX_EE_DELTA).clip(-1, 1), (droll / MAX_ROLL_DELTA).clip(-1, 1)[:, None], gripper_action[:, None]], 1
        )
        if self.control_mode == "ee_delta":
            return ee
        q = self._ik_targets(ee[:, :3] * MAX_EE_DELTA, ee[:, 3] * MAX_ROLL_DELTA, _gripper_from_action(ee[:, 4]))
        if self.control_mode == "joint_pos":
            return _normalize_joint(q).clip(-1, 1)
        delta = ((q[:, :5] - self.ctrl[:, :5]) / MAX_JOINT_DELTA).clip(-1, 1)
        return np.concatenate([delta, gripper_action[:, None]], 1)

    # ------------------------------------------------------------ robot side (rlrobot.real_robot)
    def load_measurement(self, env_index: int, qpos: np.ndarray, qvel: np.ndarray, context: dict[str, np.ndarray]) -> None:
        """Write a measured arm state and the task context (target, cube pose) into one env without stepping, then
        recompute its kinematics: the task's own observation and IK code then run on a real robot's readings."""
        d = self.datas[env_index]
        d.qpos[:6] = qpos
        d.qvel[:6] = qvel
        if "cube_pos" in context:
            d.qpos[6:9] = context["cube_pos"]
        if "cube_quat" in context:
            d.qpos[9:13] = context["cube_quat"]
        if "target" in context:
            self._set_target(np.array([env_index]), np.asarray(context["target"], np.float64)[None])
        self._kinematics(env_index)
        self._gather_all()

    def task_context(self, env_index: int) -> dict[str, np.ndarray]:
        """What a perception system would report of the task: the target and the cube pose."""
        return {"target": self.target[env_index].copy(), "cube_pos": self.cube_pos[env_index].copy(),
                "cube_quat": self.body_quat[env_index, 0].copy()}

    def joint_targets(self, action: np.ndarray, last_targets: np.ndarray) -> np.ndarray:
        """Joint targets (rad) for a batch of policy actions in this env's control mode, from the loaded state."""
        self.ctrl[: len(action)] = last_targets  # joint_delta integrates on the previous targets
        return self._actions_to_ctrl(np.asarray(action, np.float64).clip(-1.0, 1.0))

    def success_now(self) -> np.ndarray:
        """The task's success flag for the current state of every env."""
        return self._evaluate()[1]

    # ------------------------------------------------------------ resets
    def _reset_arm(self, ids: np.ndarray) -> None:
        noise = self.np_random.uniform(-START_NOISE, START_NOISE, size=(len(ids), 6))
        noise[:, 5] = 0.0
        for k, i in enumerate(ids):
            d = self.datas[i]
            q = HOME_QPOS + noise[k]
            d.qpos[:6] = q
            d.ctrl[:] = q
            self.ctrl[i] = q
            self._prev_ctrl[i] = q  # at rest
            if self.setup is not None and self._max_latency:
                self._ctrl_history[i] = q
                self.applied_ctrl[i] = q

    def object_half_height(self, i: int) -> float:
        """Half the height of env i's cube in its episode's model copy (a setup may scale its size)."""
        if not self._sized_geom_ids:
            return CUBE_HALF
        return float(self.models[self.model_index[i]].geom_size[self._sized_geom_ids[0], 2])

    def _place_cube(self, ids: np.ndarray, radius: tuple[float, float], angle: tuple[float, float]) -> None:
        """The cube on the table: in the sector (radius, angle) of the task, or in the setup's spawn box."""
        n = len(ids)
        region = self.setup.spawn.cube if self.setup is not None else None
        if region is None:
            r = self.np_random.uniform(*radius, size=n)
            a = self.np_random.uniform(*angle, size=n)
            yaw = self.np_random.uniform(-np.pi / 4, np.pi / 4, size=n)
            xy = np.stack([r * np.cos(a), r * np.sin(a)], 1)
        else:
            xy = np.asarray(region.center) + self.np_random.uniform(-1.0, 1.0, (n, 2)) * np.asarray(region.half_size)
            yaw = np.radians(self.np_random.uniform(*region.yaw_deg, size=n))
        for k, i in enumerate(ids):
            d = self.datas[i]
            d.qpos[6:9] = (xy[k, 0], xy[k, 1], self.object_half_height(int(i)))
            d.qpos[9:13] = (np.cos(yaw[k] / 2), 0.0, 0.0, np.sin(yaw[k] / 2))
            self.cube_start[i] = d.qpos[6:9]

    def _set_target(self, ids: np.ndarray, targets: np.ndarray) -> None:
        self.target[ids] = targets
        for k, i in enumerate(ids):
            self.datas[i].mocap_pos[self._mocap_id] = targets[k]

    def _reset_envs(self, ids: np.ndarray) -> None:
        self._expert_phase[ids] = 0
        self._expert_timer[ids] = 0
        if self.setup is not None:  # drawn before the arm resets (it fills the latency history)
            physics = self.setup.randomization.physics
            from .randomization import latency_draws

            self.actuation_latency[ids] = latency_draws(self.np_random, physics.actuation_latency_steps, len(ids))
            self.observation_delay[ids] = latency_draws(self.np_random, physics.observation_delay_steps, len(ids))
        self._fresh[ids] = True
        self._reset_arm(ids)
        self._reset_task(ids)

    def _reset_task(self, ids: np.ndarray) -> None:
        raise NotImplementedError

    def _task_state(self) -> dict[str, np.ndarray]:
        state = {"target": self.target, "cube_start": self.cube_start, "expert_phase": self._expert_phase,
                 "expert_timer": self._expert_timer, "prev_ctrl": self._prev_ctrl}
        if self.setup is not None:
            state.update(actuation_latency=self.actuation_latency, observation_delay=self.observation_delay)
            if self._max_latency:
                state.update(ctrl_history=self._ctrl_history, applied_ctrl=self.applied_ctrl)
        return state

    def _set_task_state(self, state: dict[str, np.ndarray]) -> None:
        self.target[:] = state["target"]
        self.cube_start[:] = state["cube_start"]
        self._expert_phase[:] = state["expert_phase"]
        self._expert_timer[:] = state["expert_timer"]
        self._prev_ctrl[:] = state.get("prev_ctrl", self.ctrl)  # states saved before servo_limits: at rest
        if "actuation_latency" in state:
            self.actuation_latency[:] = state["actuation_latency"]
            self.observation_delay[:] = state["observation_delay"]
        if "ctrl_history" in state:
            self._ctrl_history[:] = state["ctrl_history"]
            self.applied_ctrl[:] = state["applied_ctrl"]
        self._fresh[:] = True  # the profile's observation history restarts from the restored state

    def _cube_lost(self) -> np.ndarray:
        """The cube left the table (knocked off, or flung by a contact blow-up): the episode cannot go on."""
        pos = self.cube_pos
        return (pos[:, 2] < -0.05) | (pos[:, 2] > 0.5) | (np.linalg.norm(pos[:, :2] - [0.2, 0.0], axis=1) > 0.45)

    # ------------------------------------------------------------ observations
    def _arm_obs(self) -> list[np.ndarray]:
        return [self.qpos[:, :6], self.qvel[:, :6] * 0.1, self.tcp, self.tcp_axes[:, :, 0], self.tcp_axes[:, :, 1]]

    # ------------------------------------------------------------ expert
    def _move_command(self, goal: np.ndarray, gain: float = 1.0) -> np.ndarray:
        return (goal - self.tcp) * gain

    def _roll_to_cube(self) -> np.ndarray:
        """Wrist-roll delta that aligns the jaw-closing axis with a face normal of the cube."""
        jaw = self.tcp_axes[:, :, 1]
        jaw_yaw = np.arctan2(jaw[:, 1], jaw[:, 0])
        err = _wrap(self.cube_yaw - jaw_yaw, np.pi / 2)
        return -err  # the roll axis points down, so a positive roll turns the jaw clockwise seen from above

    def expert_action(self) -> torch.Tensor:
        """Scripted IK expert's action for every env, in this env's control mode."""
        dpos, droll, grip = self._expert_command()
        return torch.as_tensor(self.cartesian_action(dpos, droll, grip), dtype=torch.float32, device=self.device)

    def _expert_command(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        raise NotImplementedError


class SO101Reach(SO101Env):
    """Move the gripper's TCP to a random 3-D target (within 2 cm)."""

    task_name = "so101-reach"
    default_max_episode_steps = 50
    state_context = ("target",)
    state_dim = 6 + 6 + 3 + 3 + 3 + 3 + 3
    success_threshold = 0.02

    @property
    def instruction(self) -> list[str]:
        return ["move the gripper to the green marker"] * self.num_envs

    def _reset_task(self, ids: np.ndarray) -> None:
        n = len(ids)
        region = self.setup.spawn.target if self.setup is not None else None
        if region is None:
            r = self.np_random.uniform(0.12, 0.22, size=n)
            a = self.np_random.uniform(-0.7, 0.7, size=n)
            z = self.np_random.uniform(0.03, 0.12, size=n)
            self._set_target(ids, np.stack([r * np.cos(a), r * np.sin(a), z], 1))
        else:
            box = np.asarray(region.center) + self.np_random.uniform(-1.0, 1.0, (n, 3)) * np.asarray(region.half_size)
            self._set_target(ids, box)
        for i in ids:  # the cube stays out of the way
            self.datas[i].qpos[6:9] = (0.0, 0.3, CUBE_HALF)

    def _state_obs(self) -> np.ndarray:
        return np.concatenate(self._arm_obs() + [self.target, self.target - self.tcp], axis=1)

    def _evaluate(self):
        dist = np.linalg.norm(self.tcp - self.target, axis=1)
        success = dist < self.success_threshold
        dense = 1.0 - np.tanh(10.0 * dist)
        return dense, success, np.zeros(self.num_envs, dtype=bool)

    def _expert_command(self):
        n = self.num_envs
        return self._move_command(self.target, 0.8), np.zeros(n), np.full(n, 0.0)


class SO101Push(SO101Env):
    """Push the cube across the table onto the target marker (within 2.5 cm)."""

    task_name = "so101-push"
    default_max_episode_steps = 100
    state_context = ("target", "cube_pos", "cube_quat")
    state_dim = 6 + 6 + 3 + 3 + 3 + 3 + 4 + 3 + 3 + 3
    success_threshold = 0.025
    push_distance = 0.07

    def __init__(self, num_envs: int, **kw):
        self.push_direction = np.zeros((num_envs, 2))
        super().__init__(num_envs, **kw)

    def _task_state(self) -> dict[str, np.ndarray]:
        return {**super()._task_state(), "push_direction": self.push_direction}

    def _set_task_state(self, state: dict[str, np.ndarray]) -> None:
        super()._set_task_state(state)
        self.push_direction[:] = state["push_direction"]

    @property
    def instruction(self) -> list[str]:
        return ["push the red cube onto the green marker"] * self.num_envs

    def _reset_task(self, ids: np.ndarray) -> None:
        self._place_cube(ids, radius=(0.15, 0.18), angle=(-0.5, 0.5))
        cube = self.cube_start[ids]
        base_angle = np.arctan2(cube[:, 1], cube[:, 0])
        angle = base_angle + self.np_random.uniform(-0.4, 0.4, size=len(ids))
        target = cube + self.push_distance * np.stack([np.cos(angle), np.sin(angle), np.zeros(len(ids))], 1)
        target[:, 2] = 0.001
        self._set_target(ids, target)
        self.push_direction[ids] = np.stack([np.cos(angle), np.sin(angle)], 1)

    def _state_obs(self) -> np.ndarray:
        return np.concatenate(
            self._arm_obs() + [self.cube_pos, self.body_quat[:, 0], self.target, self.cube_pos - self.pusher,
                               self.target - self.cube_pos], axis=1)

    def _push_pose(self) -> tuple[np.ndarray, np.ndarray]:
        """Where the pusher goes to push the cube along the episode's fixed push direction."""
        direction = self.push_direction
        pose = self.cube_pos.copy()
        pose[:, :2] -= direction * (CUBE_HALF * np.sqrt(2) + PUSHER_HALF_WIDTH + 0.005)  # clear a yawed cube
        pose[:, 2] = 0.022
        return pose, direction

    def _contact_pose(self) -> np.ndarray:
        """The pusher against the cube's face away from the target. The reward's reach term aims here, not at the
        expert's approach pose 1.1 cm further back: aiming there made "hover behind the cube" a local optimum, since
        closing the gap to the cube cost reach reward before the cube moved (SAC and PPO both parked there). The
        side follows the current cube-to-target direction, not the episode's initial one: after an overshoot the
        reach term then leads round to the far side to push the cube back (with the initial direction it pulled the
        arm behind the overshot cube, where pushing only moves it further away, and SAC gave up there).
        While the pusher is not behind the cube the pose is raised 4 cm: the way round then leads over the cube, not
        through it (SAC parked with the jaws against the cube's side or front, pressing it further off)."""
        return push_contact_pose(self.cube_pos, self.target, self.pusher, self.push_direction)

    def _evaluate(self):
        cube_to_target = np.linalg.norm(self.cube_pos[:, :2] - self.target[:, :2], axis=1)
        reach = 1.0 - np.tanh(10.0 * np.linalg.norm(self.pusher - self._contact_pose(), axis=1))
        place = 1.0 - np.tanh(10.0 * cube_to_target)
        lost = self._cube_lost()
        success = (cube_to_target < self.success_threshold) & ~lost
        # on target the reach term is dropped: with it SAC kept pressing the pusher against the placed cube and shoved
        # it past the target (92 % of its episodes touched success, 73 % ended there). Success pays 0.8-1.0, the top
        # for the cube at the target's centre and the arm at rest: with a flat 1.0 (ManiSkill PushCube's convention)
        # SAC reached the target in 98 % of episodes but its arm wandered on and knocked the cube out again in 17 %.
        # Short of success the reward stays <= 0.51.
        centre = 1.0 - np.tanh(40.0 * cube_to_target)
        still = 1.0 - np.tanh(5.0 * np.linalg.norm(self.qvel[:, :5], axis=1))  # as ManiSkill's static-robot terms
        dense = np.where(success, 0.8 + 0.1 * centre + 0.1 * still, (reach + 2.0 * place) / 5.0)
        return dense, success, lost

    def _expert_command(self):
        n = self.num_envs
        pose, direction = self._push_pose()
        above = pose.copy()
        above[:, 2] = 0.06
        phase = self._expert_phase
        # 0: above the push pose, jaw face turned toward the push direction; 1: down behind the cube; 2: push
        jaw = self.tcp_axes[:, :, 1]
        roll_err = _wrap(np.arctan2(direction[:, 1], direction[:, 0]) - np.arctan2(jaw[:, 1], jaw[:, 0]), np.pi)
        droll = np.where(phase == 0, -roll_err, 0.0)
        at_above = (np.linalg.norm(self.pusher - above, axis=1) < 0.012) & (np.abs(roll_err) < 0.1)
        behind = np.linalg.norm(self.pusher - pose, axis=1) < 0.01
        phase[(phase == 0) & at_above] = 1
        phase[(phase == 1) & behind] = 2
        goal = np.where((phase == 0)[:, None], above, pose)
        push_goal = self.target.copy()
        push_goal[:, :2] -= direction * (CUBE_HALF + PUSHER_HALF_WIDTH)
        push_goal[:, 2] = 0.022
        goal = np.where((phase == 2)[:, None], push_goal, goal)
        # the cube slipped sideways off the jaw: go back above the push pose
        lost = (phase == 2) & (np.linalg.norm(self.pusher[:, :2] - pose[:, :2], axis=1) > 0.03)
        phase[lost] = 0
        move = (goal - self.pusher) * 0.8
        # push gently (<= 1 cm per step) so that the cube slides instead of tipping
        norm = np.linalg.norm(move, axis=1, keepdims=True)
        slow = np.where((phase == 2)[:, None], np.minimum(1.0, 0.01 / np.maximum(norm, 1e-9)), 1.0)
        return move * slow, droll, np.full(n, PUSH_GRIPPER_ACTION)


class SO101Lift(SO101Env):
    """Grasp the cube and lift it at least 5 cm above the table; success is judged with the cube still held up.

    Reward modes: ``dense`` (reach, open-jaw approach, grasp, lift, success; what SFT + flow RL use), ``sparse``
    (success), ``staged`` (ManiSkill3 PickCube's shape, ``_staged_reward``: what PPO from scratch learns lift with)."""

    task_name = "so101-lift"
    default_max_episode_steps = 100
    state_dim = 6 + 6 + 3 + 3 + 3 + 3 + 4 + 3 + 2
    lift_height = 0.05
    staged_goal_height = 0.08  # the staged reward's goal above the table, past the 5 cm success height
    reward_modes = (*REWARD_MODES, "staged")

    @property
    def instruction(self) -> list[str]:
        return ["pick up the red cube"] * self.num_envs

    def _reset_task(self, ids: np.ndarray) -> None:
        self._place_cube(ids, radius=(0.13, 0.2), angle=(-0.6, 0.6))
        self._set_target(ids, np.tile([0.0, 0.3, -0.5], (len(ids), 1)))  # marker unused: below the table

    def _state_obs(self) -> np.ndarray:
        return np.concatenate(self._arm_obs() + [self.cube_pos, self.body_quat[:, 0], self.cube_pos - self.tcp,
                                                 self.contacts], axis=1)

    def _evaluate(self):
        tcp_to_cube = np.linalg.norm(self.tcp - self.cube_pos, axis=1)
        reach = 1.0 - np.tanh(10.0 * tcp_to_cube)
        grasped = self.contacts.all(axis=1) & (tcp_to_cube < 0.03)  # both jaws touch the cube
        height = self.cube_pos[:, 2] - CUBE_HALF
        lifted = np.clip(height / self.lift_height, 0.0, 1.0)
        lost = self._cube_lost()
        success = (height >= self.lift_height) & grasped & ~lost  # lifted and held, not flung
        # the revolute jaw blocks the cube when closed: reward an open jaw until the cube is grasped, else "hover
        # closed just above the cube" is a local optimum of the reach term; grasping (+1) outweighs the open bonus
        gripper_open = np.clip((self.qpos[:, 5] - 0.3) / 0.7, 0.0, 1.0)
        approach = 0.5 * gripper_open * ~grasped
        dense = (reach + approach + grasped + 2.0 * lifted * grasped + success) / 5.5
        if self.reward_mode == "staged":
            dense = self._staged_reward(tcp_to_cube, grasped, success)
        return dense, success, lost

    def _staged_reward(self, tcp_to_cube: np.ndarray, grasped: np.ndarray, success: np.ndarray) -> np.ndarray:
        """ManiSkill3 PickCube's staged reward on our task: reach 1 - tanh(5 d), + 1 while grasped, + how close the
        held cube is to a point 8 cm above its start (1 - tanh(5 d_goal)), and the maximum 5 on success (absorbing:
        no term can beat succeeding); / 5. No open-jaw bonus: closing on the cube never costs reward."""
        reach = 1.0 - np.tanh(5.0 * tcp_to_cube)
        goal = self.cube_start.copy()
        goal[:, 2] = CUBE_HALF + self.staged_goal_height
        to_goal = 1.0 - np.tanh(5.0 * np.linalg.norm(goal - self.cube_pos, axis=1))
        staged = reach + grasped + to_goal * grasped
        return np.where(success, 5.0, staged) / 5.0

    def _expert_command(self):
        n = self.num_envs
        phase, timer = self._expert_phase, self._expert_timer
        above = self.cube_pos + np.array([0.0, 0.0, 0.05])
        grasp = self.cube_pos + np.array([0.0, 0.0, 0.003])
        droll = self._roll_to_cube()
        aligned = np.abs(droll) < 0.05
        # 0: above the cube, jaw open and aligned; 1: down to it; 2: close; 3: lift and hold
        phase[(phase == 0) & (np.linalg.norm(self.tcp - above, axis=1) < 0.01) & aligned] = 1
        phase[(phase == 1) & (np.linalg.norm(self.tcp - grasp, axis=1) < 0.006)] = 2
        timer[phase == 2] += 1
        closed = (timer > 3) & (np.abs(self.qvel[:, 5]) < 0.05) | (timer > 20)  # the jaw has stopped on the cube
        phase[(phase == 2) & closed] = 3
        goal = np.where((phase == 0)[:, None], above, grasp)
        lift_goal = np.concatenate([self.cube_start[:, :2], np.full((n, 1), 0.12)], 1)
        goal = np.where((phase == 3)[:, None], lift_goal, goal)
        goal = np.where((phase == 2)[:, None], self.tcp, goal)
        grip = np.where(phase >= 2, -1.0, 0.3)
        roll = np.where(phase <= 1, droll, 0.0)
        return self._move_command(goal, 0.8), roll, grip


def check_option(task: str, name: str, value) -> None:
    """What the SO-101 tasks accept as a run option's value (one-line errors): a readable, valid setup file."""
    if name == "setup":
        load_setup(value)


TASKS: dict[str, type[SO101Env]] = {cls.task_name: cls for cls in (SO101Reach, SO101Push, SO101Lift)}
for _cls in TASKS.values():
    register_task(TaskSpec(_cls.task_name, _cls, SO101_OBS_MODES, _cls.reward_modes, CONTROL_MODES,
                           _cls.default_max_episode_steps, options=("servo_limits", "setup"), check_option=check_option))
