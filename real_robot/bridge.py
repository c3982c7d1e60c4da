"""Robot-side task model: the simulator's own observation and control-mode code run on a robot's readings.

A policy trained in simulation sees the task's state vector (joint positions and velocities, TCP pose from forward
kinematics, target, cube pose, ...) and emits actions in its control mode (absolute joint targets, joint deltas, or
Cartesian TCP deltas through IK). ``TaskBridge`` keeps a one-env shadow of the task (never stepped): each control
step it loads the measured joints and the task context, recomputes kinematics, and reads the observation and the
joint targets with exactly the code the policy was trained with, so sim and robot cannot drift apart.

A policy that reads the instruction (``instruction_tokens`` / ``instruction_embedding``: the language suite's) gets
the reading's ``instruction`` (the twin's task), else ``instruction`` (the operator's, ``rlrobot deploy --instruction``),
encoded as the task encodes it.

A policy that reads cameras (``image_<camera>``, e.g. a VLA or a flow policy trained on ``--obs-mode state+rgb``)
gets the robot's frames of those cameras as they are: the reading's ``images`` {camera: HxWx3 uint8} at the size it
was trained on (the sighted twin renders them so). ``camera_map`` {policy camera: robot camera} names the robot's
camera where the two names differ (``rlrobot deploy --camera-map up=front``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

import rlrobot
from rlrobot.tasks.profile import IMAGE_PREFIX, LANGUAGE_KEYS
from rlrobot.tasks.registry import is_adapter_task


def parse_camera_map(text: str | None) -> dict[str, str]:
    """``POLICY=ROBOT,...`` -> {policy camera: robot camera}; a one-line ValueError names what is wrong."""
    mapping: dict[str, str] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        policy, sep, robot = (part.strip() for part in item.partition("="))
        if not sep or not policy or not robot:
            raise ValueError(f"camera_map={text!r}: each entry must be POLICY_CAMERA=ROBOT_CAMERA (e.g. up=front,side=wrist)")
        if policy in mapping:
            raise ValueError(f"camera_map={text!r} names the policy's camera {policy!r} twice")
        mapping[policy] = robot
    return mapping


def policy_cameras(keys: list[str] | tuple[str, ...]) -> list[str]:
    """The camera names of the ``image_<camera>`` keys among a policy's observation keys."""
    return [k[len(IMAGE_PREFIX):] for k in keys if k.startswith(IMAGE_PREFIX)]


class TaskBridge:
    """``keys``: the observations the policy's actor reads (default the state only); ``image_shapes`` {key: [3, H, W]}:
    the frames' shapes it was trained on (its observation space)."""

    def __init__(self, task: str, control_mode: str, keys: list[str] | tuple[str, ...] = ("state",),
                 camera_map: dict[str, str] | None = None, image_shapes: dict[str, Any] | None = None):
        if is_adapter_task(task):
            raise ValueError(f"task={task!r}: only native rlrobot tasks (e.g. so101-reach) have a robot-side model")
        self.task, self.control_mode = task, control_mode
        self.keys = list(keys)
        self.cameras = policy_cameras(self.keys)
        """the policy's camera names (its ``image_<camera>`` keys)"""
        self.camera_map = {cam: (camera_map or {}).get(cam, cam) for cam in self.cameras}
        self.robot_cameras = list(self.camera_map.values())
        """the robot's cameras that give them, in the same order"""
        self.image_shapes = {k: tuple(int(n) for n in v) for k, v in (image_shapes or {}).items()}
        self.shadow = rlrobot.make(task, 1, control_mode=control_mode, num_threads=1, obs_mode="state")
        self.shadow.reset(seed=0)
        self.action_dim = self.shadow.action_dim
        self.instruction = self.shadow.instruction[0]

    def observation(self, measured: dict[str, Any]) -> dict[str, np.ndarray]:
        """The policy's observation (batch of one) from a robot reading: the task's state and, for a policy that reads
        cameras, the robot's frames of them as [1, 3, H, W] uint8. A missing or wrongly sized frame raises ValueError
        naming the camera (nothing is made up)."""
        self.shadow.load_measurement(0, measured["qpos"], measured["qvel"], measured.get("context", {}))
        obs = {"state": self.shadow._state_obs().astype(np.float32)}
        frames = measured.get("images") or {}
        for cam, robot_cam in self.camera_map.items():
            frame = frames.get(robot_cam)
            if frame is None:
                raise ValueError(f"the robot's reading has no frame from camera {robot_cam!r} (the policy's {cam!r}; it has "
                                 f"{sorted(frames)})")
            image = np.ascontiguousarray(np.asarray(frame, np.uint8).transpose(2, 0, 1))[None]
            expected = self.image_shapes.get(IMAGE_PREFIX + cam)
            if expected is not None and image.shape[1:] != expected:
                raise ValueError(f"camera {robot_cam!r} gives {image.shape[1:]} frames (3, H, W); the policy's "
                                 f"{IMAGE_PREFIX + cam} was trained on {expected}")
            obs[IMAGE_PREFIX + cam] = image
        language = [k for k in self.keys if k in LANGUAGE_KEYS]
        if language:  # the operator's instruction (deploy --instruction; the twin reports the task it set up)
            encoded = self.shadow.instruction_observation([measured.get("instruction") or self.instruction])
            obs.update({k: np.asarray(encoded[k]) for k in language})
        return obs

    def joint_targets(self, action: np.ndarray, measured: dict[str, Any], last_targets: np.ndarray) -> np.ndarray:
        """Joint targets (rad) for one policy action, computed from the reading passed to ``observation``."""
        self.shadow.load_measurement(0, measured["qpos"], measured["qvel"], measured.get("context", {}))
        return self.shadow.joint_targets(np.asarray(action, np.float64).reshape(1, -1), last_targets[None])[0]

    def tcp_position(self, qpos: np.ndarray) -> np.ndarray:
        """Forward kinematics of the TCP for joint positions ``qpos`` (rad), e.g. to check a workspace box."""
        self.shadow.load_measurement(0, qpos, np.zeros(6), {})
        return self.shadow.tcp[0].copy()

    def close(self) -> None:
        self.shadow.close()
