"""Robot-side task model: the simulator's own observation and control-mode code run on a robot's readings.

A policy trained in simulation sees the task's state vector (joint positions and velocities, TCP pose from forward
kinematics, target, cube pose, ...) and emits actions in its control mode (absolute joint targets, joint deltas, or
Cartesian TCP deltas through IK). ``TaskBridge`` keeps a one-env shadow of the task (never stepped): each control
step it loads the measured joints and the task context, recomputes kinematics, and reads the observation and the
joint targets with exactly the code the policy was trained with, so sim and robot cannot drift apart.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import rlrobot
from rlrobot.tasks.registry import is_adapter_task


class TaskBridge:
    def __init__(self, task: str, control_mode: str):
        if is_adapter_task(task):
            raise ValueError(f"task={task!r}: only native rlrobot tasks (e.g. so101-reach) have a robot-side model")
        self.task, self.control_mode = task, control_mode
        self.shadow = rlrobot.make(task, 1, control_mode=control_mode, num_threads=1, obs_mode="state")
        self.shadow.reset(seed=0)
        self.action_dim = self.shadow.action_dim
        self.instruction = self.shadow.instruction[0]

    def observation(self, measured: dict[str, Any]) -> dict[str, np.ndarray]:
        """The policy's observation (batch of one) from a robot reading."""
        self.shadow.load_measurement(0, measured["qpos"], measured["qvel"], measured.get("context", {}))
        return {"state": self.shadow._state_obs().astype(np.float32)}

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
