"""The LeRobot SO-101 observation profile: what a real SO-101 driven through LeRobot gives a policy, and nothing more.

LeRobot's SO-101 follower (``lerobot.robots.so_follower.SOFollower``, LeRobot 0.4.4 and 0.6.x) reads six motors in
this order, ``shoulder_pan, shoulder_lift, elbow_flex, wrist_flex, wrist_roll, gripper``, and reports each as
``<motor>.pos``; ``lerobot-record`` stacks them, in that order, into the dataset feature ``observation.state``
(``names`` = the six ``<motor>.pos``) and stores each configured camera as ``observation.images.<camera>``
(HxWx3 uint8). ``action`` has the same six names and units: absolute joint targets. Units (``MotorNormMode``):

- body joints with ``use_degrees=True`` (the follower's default since LeRobot 0.4.4): degrees, 0 in the middle of the
  calibrated range, ``(ticks - mid) * 360 / 4095``: a physical angle in degrees times 4096 / 4095;
- body joints with ``use_degrees=False`` (before 0.4.4): -100..100 over the calibrated range;
- the gripper always: 0..100 over its calibrated range (0 = closed, 100 = fully open).

In simulation the calibrated range of a joint is the model's joint range (``tasks/so101.py``, whose zero is the
middle of each range like LeRobot's calibration), so the six readings of the profile are the simulated joint angles
in LeRobot's units. On a real arm the driver (``real_robot/drivers/lerobot.py``) turns LeRobot's values into radians
with the arm's own calibration, and this module's ``ProfileUnits`` turns radians into profile units: the same
function on both sides. -100..100 units depend on each arm's calibrated range (a real arm's differs from the model's),
degrees do not: prefer ``use_degrees`` (the default).

Observation keys of a profile env (``--obs-mode lerobot``) and the dataset features they are stored as:

===========================  ==============================  ==========================================
env observation key          dataset feature (LeRobot's)     what
===========================  ==============================  ==========================================
``state``                    ``observation.state``           float32 [6]: the ``<motor>.pos`` readings
``image_<camera>``           ``observation.images.<camera>`` uint8 [3, S, S] (stored HxWx3): ``prepare_frames``
``instruction_tokens`` /     (the frame's task string)       the suite's instruction, as the operator gives it
``instruction_embedding``
``privileged_state``         (not stored)                    PRIVILEGED: the simulator's full task state
===========================  ==============================  ==========================================

``privileged_state`` is the task's state vector of ``--obs-mode state`` (object poses, targets, contacts): critics,
value functions, process reward models and teachers may read it; an actor that runs on a real arm may not, and
``rlrobot deploy`` refuses one that does (``real_robot/observation_check.py``). Camera frames of the real arm and of
the simulator go through the one function ``prepare_frames`` (crop, then resize to the training size).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

PROFILE_OBS_MODE = "lerobot"
MOTOR_NAMES = ("shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper")
"""LeRobot's SO-101 follower's motors, in its bus order (motor ids 1..6)"""
STATE_NAMES = tuple(f"{m}.pos" for m in MOTOR_NAMES)
"""``names`` of the ``observation.state`` and ``action`` features that ``lerobot-record`` writes"""
STATE_KEY = "state"
"""the profile's joint readings (dataset feature ``observation.state``)"""
PRIVILEGED_KEY = "privileged_state"
"""the simulator's task state: for critics, value functions, PRMs and teachers, never for an actor on a real arm"""
PRIVILEGED_PREFIX = "privileged_"
"""every observation key that starts with it is privileged"""
LANGUAGE_KEYS = ("instruction_tokens", "instruction_embedding")
"""made from the instruction's words, which the operator gives on a real arm too"""
IMAGE_PREFIX = "image_"
TICKS_PER_TURN = 4096  # STS3215 encoder resolution
DEGREE_SCALE = TICKS_PER_TURN / (TICKS_PER_TURN - 1)
"""LeRobot's degrees per physical degree: it divides ticks by 4095, a turn is 4096 ticks"""


def image_key(camera: str) -> str:
    """Env observation key of a camera (``front`` -> ``image_front``; dataset feature ``observation.images.front``)."""
    return IMAGE_PREFIX + camera


def is_privileged(key: str) -> bool:
    return key.startswith(PRIVILEGED_PREFIX)


@dataclass(frozen=True)
class ProfileUnits:
    """Joint radians of the model <-> LeRobot's SO-101 units (``use_degrees`` as the follower's config). ``low`` /
    ``high``: the joint ranges in radians (the model's), the calibrated range in simulation."""

    low: tuple[float, ...]
    high: tuple[float, ...]
    use_degrees: bool = True

    def __post_init__(self):
        if len(self.low) != len(MOTOR_NAMES) or len(self.high) != len(MOTOR_NAMES):
            raise ValueError(f"ProfileUnits needs {len(MOTOR_NAMES)} joint ranges, got {len(self.low)} and {len(self.high)}")

    @property
    def body_mode(self) -> str:
        return "degrees" if self.use_degrees else "range_m100_100"

    def to_profile(self, radians: np.ndarray) -> np.ndarray:
        """[..., 6] joint angles (rad) -> [..., 6] ``<motor>.pos`` values (float64)."""
        q = np.asarray(radians, np.float64)
        low, high = np.asarray(self.low), np.asarray(self.high)
        out = np.empty_like(q)
        if self.use_degrees:
            out[..., :5] = np.degrees(q[..., :5]) * DEGREE_SCALE
        else:
            centre, half = 0.5 * (low[:5] + high[:5]), 0.5 * (high[:5] - low[:5])
            out[..., :5] = (q[..., :5] - centre) / half * 100.0
        out[..., 5] = (q[..., 5] - low[5]) / (high[5] - low[5]) * 100.0
        return out

    def to_radians(self, values: np.ndarray) -> np.ndarray:
        """[..., 6] ``<motor>.pos`` values -> [..., 6] joint angles (rad) (float64)."""
        v = np.asarray(values, np.float64)
        low, high = np.asarray(self.low), np.asarray(self.high)
        out = np.empty_like(v)
        if self.use_degrees:
            out[..., :5] = np.radians(v[..., :5] / DEGREE_SCALE)
        else:
            centre, half = 0.5 * (low[:5] + high[:5]), 0.5 * (high[:5] - low[:5])
            out[..., :5] = centre + v[..., :5] / 100.0 * half
        out[..., 5] = low[5] + v[..., 5] / 100.0 * (high[5] - low[5])
        return out

    def normalized_to_profile(self, action: np.ndarray) -> np.ndarray:
        """A joint_pos action in [-1, 1] (the env's action space) -> the absolute targets in profile units."""
        a = np.asarray(action, np.float64)
        low, high = np.asarray(self.low), np.asarray(self.high)
        return self.to_profile(low + (a + 1.0) * 0.5 * (high - low))

    def profile_to_normalized(self, values: np.ndarray) -> np.ndarray:
        """Absolute targets in profile units -> the joint_pos action in [-1, 1] that commands them (clipped)."""
        low, high = np.asarray(self.low), np.asarray(self.high)
        q = self.to_radians(values)
        return (2.0 * (q - low) / (high - low) - 1.0).clip(-1.0, 1.0)

    def profile_range(self) -> tuple[np.ndarray, np.ndarray]:
        """(low, high) of each ``<motor>.pos`` over the joint ranges, in profile units."""
        return self.to_profile(np.asarray(self.low)), self.to_profile(np.asarray(self.high))


# ------------------------------------------------------------------------------------------------ camera frames
def _span(n: int, start: float, length: float) -> tuple[int, int]:
    """(first pixel, pixels) of the fraction [start, start + length) of an axis of n pixels."""
    first = min(int(round(start * n)), n - 1)
    return first, min(max(1, int(round(length * n))), n - first)


def centred_square(height: int, width: int) -> tuple[float, float, float, float]:
    side = min(height, width)
    return (height - side) / 2 / height, (width - side) / 2 / width, side / height, side / width


def crop_box(height: int, width: int, crop: tuple[float, float, float, float] | None) -> tuple[int, int, int, int]:
    """(top, left, h, w) pixels of a crop given as fractions (top, left, height, width) of an HxW frame; None: the
    largest centred square."""
    if crop is None:
        side = min(height, width)
        return (height - side) // 2, (width - side) // 2, side, side
    top, bh = _span(height, crop[0], crop[2])
    left, bw = _span(width, crop[1], crop[3])
    return top, left, bh, bw


def render_shape(size: int, frame_shape: tuple[int, int], crop: tuple[float, float, float, float] | None
                 ) -> tuple[int, int]:
    """(H, W) to render a camera at so that its crop is exactly ``size`` x ``size`` pixels with the aspect ratio of its
    frames (``frame_shape`` = the real camera's (height, width)): the simulator renders small and its crop needs no
    resampling, while the real camera's full-size frames are cropped at the same fractions and resized."""
    top, left, h, w = crop if crop is not None else centred_square(*frame_shape)
    shape = []
    for start, length in ((top, h), (left, w)):
        guess = size / length
        for n in sorted(range(max(size, int(guess) - 3), int(math.ceil(guess)) + 4), key=lambda n: abs(n - guess)):
            if _span(n, start, length)[1] == size:
                shape.append(n)
                break
        else:
            raise ValueError(f"cannot render a crop of {size} px at the fraction {length:g} of a frame axis")
    return shape[0], shape[1]


def prepare_frames(frames: np.ndarray, crop: tuple[float, float, float, float] | None, size: int) -> np.ndarray:
    """The one image preprocessing of the profile, for simulated and real frames alike: crop ``[..., H, W, 3]``
    uint8 frames at ``crop`` (fractions, None: centred square), then resize to ``size`` x ``size`` (area averaging
    when shrinking, bilinear when enlarging). Returns ``[..., size, size, 3]`` uint8; a crop that is already
    ``size`` x ``size`` is returned as is (what the simulator renders, ``render_shape``)."""
    frames = np.asarray(frames)
    if frames.dtype != np.uint8 or frames.ndim < 3 or frames.shape[-1] != 3:
        raise ValueError(f"camera frames must be [..., H, W, 3] uint8, got {frames.shape} {frames.dtype}")
    h, w = frames.shape[-3:-1]
    top, left, bh, bw = crop_box(h, w, crop)  # None: the frame's own centred square
    cropped = frames[..., top:top + bh, left:left + bw, :]
    if (bh, bw) == (size, size):
        return np.ascontiguousarray(cropped)
    from PIL import Image

    lead = cropped.shape[:-3]
    flat = cropped.reshape(-1, bh, bw, 3)
    method = Image.Resampling.BOX if bh >= size and bw >= size else Image.Resampling.BILINEAR
    out = np.stack([np.asarray(Image.fromarray(f).resize((size, size), method)) for f in flat])
    return out.reshape(*lead, size, size, 3)
