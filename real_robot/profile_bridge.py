"""Robot-side model of a policy trained in the LeRobot SO-101 profile (``--obs-mode lerobot``).

The policy's observation is what the arm gives, in the profile's units: ``state`` from the measured joints
(``ProfileUnits``, the same conversion the simulated profile uses) and ``image_<camera>`` from the robot's frames
through ``prepare_frames`` (the same crop and resize as in training), plus the instruction's tokens / embedding for
the language suite. No task context is read: a reading's ``context`` (if any) is ignored. Joint targets of the
policy's actions come from a one-env shadow of the task, loaded with the measured joints only (the IK of
``ee_delta`` needs nothing else).
"""

from __future__ import annotations

from typing import Any

import numpy as np

import rlrobot
from rlrobot.tasks.profile import IMAGE_PREFIX, LANGUAGE_KEYS, STATE_KEY, prepare_frames
from rlrobot.tasks.setup import Setup


def profile_observation(setup: Setup, units, qpos: np.ndarray, frames: dict[str, np.ndarray], keys: list[str],
                        camera_map: dict[str, str] | None = None) -> dict[str, np.ndarray]:
    """The profile observation (batch of one) of the keys ``keys`` from joint positions (rad) and camera frames
    (HxWx3 uint8 at any resolution, by camera name; ``camera_map`` {policy camera: robot camera} where the names
    differ). A missing frame raises ValueError naming the camera."""
    obs: dict[str, np.ndarray] = {}
    if STATE_KEY in keys:
        obs[STATE_KEY] = units.to_profile(np.asarray(qpos, np.float64)).astype(np.float32)[None]
    for key in keys:
        if not key.startswith(IMAGE_PREFIX):
            continue
        name = (camera_map or {}).get(key[len(IMAGE_PREFIX):], key[len(IMAGE_PREFIX):])
        frame = frames.get(name)
        if frame is None:
            raise ValueError(f"the robot's reading has no frame from camera {name!r} (it has {sorted(frames)})")
        cam = setup.cameras[name]
        image = prepare_frames(np.asarray(frame), cam.crop_fractions(), setup.image_size)
        obs[key] = np.ascontiguousarray(image.transpose(2, 0, 1))[None]
    return obs


class ProfileBridge:
    """The ``TaskBridge`` interface (``observation``, ``joint_targets``, ``tcp_position``, ``action_dim``,
    ``instruction``, ``control_mode``) for profile policies; ``keys``: the observations the policy reads."""

    def __init__(self, task: str, control_mode: str, setup: Setup, keys: list[str], camera_map: dict[str, str] | None = None):
        from rlrobot.tasks.so101 import profile_units

        self.task, self.control_mode, self.setup, self.keys = task, control_mode, setup, list(keys)
        self.units = profile_units(setup.use_degrees)
        self.shadow = rlrobot.make(task, 1, control_mode=control_mode, num_threads=1, obs_mode="state", setup=setup)
        self.shadow.reset(seed=0)
        self.action_dim = self.shadow.action_dim
        self.instruction = self.shadow.instruction[0]
        self.state_dim = len(self.units.low)
        self.cameras = [k[len(IMAGE_PREFIX):] for k in self.keys if k.startswith(IMAGE_PREFIX)]
        """the policy's camera names (its ``image_<camera>`` keys; the recorder's names)"""
        self.camera_map = {cam: (camera_map or {}).get(cam, cam) for cam in self.cameras}
        self.robot_cameras = list(self.camera_map.values())
        """the robot's (the setup's) cameras that give them, in the same order"""

    def observation(self, measured: dict[str, Any]) -> dict[str, np.ndarray]:
        obs = profile_observation(self.setup, self.units, measured["qpos"], measured.get("images", {}), self.keys,
                                  self.camera_map)
        language = [k for k in self.keys if k in LANGUAGE_KEYS]
        if language:  # the operator's instruction (the twin reports the task it set up)
            text = measured.get("instruction") or self.instruction
            encoded = self.shadow.instruction_observation([text])
            obs.update({k: np.asarray(encoded[k]) for k in language})
        return obs

    def joint_targets(self, action: np.ndarray, measured: dict[str, Any], last_targets: np.ndarray) -> np.ndarray:
        self.shadow.load_measurement(0, measured["qpos"], measured.get("qvel", np.zeros(6)), {})
        return self.shadow.joint_targets(np.asarray(action, np.float64).reshape(1, -1), last_targets[None])[0]

    def tcp_position(self, qpos: np.ndarray) -> np.ndarray:
        self.shadow.load_measurement(0, qpos, np.zeros(6), {})
        return self.shadow.tcp[0].copy()

    def close(self) -> None:
        self.shadow.close()
