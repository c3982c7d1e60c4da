"""``rlrobot camera``: photos of the arm at known joints, automatic alignment of a world camera, and an overlay to check.

    rlrobot camera capture --setup station.json --camera front --out photos/ --robot lerobot \\
        --lerobot-cameras front=0 --allow-joints shoulder_pan shoulder_lift elbow_flex wrist_flex
    rlrobot camera align --setup station.json --photos photos/          # writes the camera's pose into the setup
    rlrobot camera overlay --setup station.json --photos photos/ --out overlay.png

``capture`` moves the arm through the calibration poses (``CALIBRATION_POSES``) and saves a frame and the measured
joints at each. Every motion goes through the safety supervisor and the one checked command path of the chunk
executor, slowly (``--speed``, rad/s), and only the joints named in ``--allow-joints`` move: the others are
commanded to stay where they were read before the first move. ``--robot twin`` takes the photos in the simulator
(the blind twin of ``--twin-setup``, which may hold a camera other than ``--setup``'s: synthetic photos whose true
camera is known). ``align`` estimates the camera's position, orientation and field of view from the photos
(``tasks/camera_alignment.py``) and writes them, with the reprojection error, into the setup file (``--out`` for
another file). ``overlay`` draws the simulated arm over each photo from the setup's camera (a PNG).
"""

from __future__ import annotations

import datetime
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from rlrobot.domains import Positive
from rlrobot.real_robot.bridge import TaskBridge
from rlrobot.real_robot.deploy import DeployArgs, lerobot_camera_specs
from rlrobot.real_robot.drivers import make_robot
from rlrobot.real_robot.executor import ChunkExecutor, ExecutorConfig
from rlrobot.real_robot.safety import SafetyConfig, SafetySupervisor
from rlrobot.tasks.camera_alignment import CALIBRATION_POSES, CameraPose, Photo, align_camera, load_photos, overlay, save_photos
from rlrobot.tasks.cameras import mat_to_quat
from rlrobot.tasks.randomization import scene_parts
from rlrobot.tasks.setup import load_setup, save_setup
from rlrobot.tasks.so101 import JOINT_NAMES, SO101Env, _normalize_joint, profile_units

console = Console(soft_wrap=True)
READINGS_PER_PHOTO = 16
"""joint readings averaged per photo (the arm holds still): a reading's noise, 0.3 deg, moves the arm's outline and
the camera's fitted distance by about a centimetre; averaged over 16 it is a quarter of that"""
SUBCOMMANDS = {"capture": "photos of the arm at known joints", "align": "the camera's pose from photos",
               "overlay": "the simulated arm over the photos (PNG)"}


@dataclass
class CaptureArgs:
    setup: str
    """the station's setup file"""
    out: str
    """directory for the photos and poses.json (must not hold photos yet)"""
    camera: str = "front"
    robot: str = "lerobot"
    """lerobot (the arm) | twin (the simulator: synthetic photos)"""
    allow_joints: tuple[str, ...] = ()
    """the joints the arm may move (names, or 'all'); the others stay where they are"""
    poses: int = 8
    """how many of the 14 calibration poses (8: about 20 s of alignment on 2 CPU cores; all 14: better, slower)"""
    speed: Positive = 0.4
    """rad/s of the moving joints (the supervisor's limits apply on top)"""
    settle_s: Positive = 1.0
    """wait after each move before the photo"""
    lerobot_port: str = "/dev/ttyACM0"
    lerobot_id: str = "rlrobot_so101"
    lerobot_cameras: str | None = None
    """NAME=INDEX_OR_PATH of the camera (default: the setup's device)"""
    twin_setup: str | None = None
    """(twin) the setup the twin renders with (its camera is the 'true' one); default --setup"""
    seed: int = 0


@dataclass
class AlignArgs:
    setup: str
    photos: str
    """a directory of capture (poses.json + images)"""
    camera: str | None = None
    """the setup's camera the photos are from (default: the one poses.json names)"""
    out: str | None = None
    """write the aligned setup here (default: overwrite --setup)"""
    seed: int = 0


@dataclass
class OverlayArgs:
    setup: str
    photos: str
    out: str = "camera_overlay.png"
    camera: str | None = None


def main(argv: list[str]) -> Any:
    import tyro

    if not argv or argv[0] in ("-h", "--help") or argv[0] not in SUBCOMMANDS:
        usage = "usage: rlrobot camera {capture,align,overlay} [options]\n" + "".join(
            f"  {name:<8} {what}\n" for name, what in SUBCOMMANDS.items())
        if argv and argv[0] not in ("-h", "--help"):
            raise ValueError(f"camera: {argv[0]!r} is not one of {tuple(SUBCOMMANDS)}")
        print(usage)
        return None
    name, rest = argv[0], argv[1:]
    if name == "capture":
        return capture(tyro.cli(CaptureArgs, args=rest, prog="rlrobot camera capture"))
    if name == "align":
        return align(tyro.cli(AlignArgs, args=rest, prog="rlrobot camera align"))
    return overlay_command(tyro.cli(OverlayArgs, args=rest, prog="rlrobot camera overlay"))


# ------------------------------------------------------------------------------------------------------ capture
class PoseSource:
    """A scripted policy source for the chunk executor: absolute joint targets (the joint_pos action) ramping from
    where the arm is to a pose at ``speed``, then holding it; later requests of the same move hold the pose."""

    def __init__(self, rate_hz: float, speed: float):
        self.rate_hz, self.speed = rate_hz, speed
        self.chunk = np.zeros((1, 6), np.float32)
        self.hold = self.chunk
        self.requests = 0
        self.metadata = {"control_rate_hz": rate_hz, "chunk_size": 1024}

    def plan(self, start: np.ndarray, target: np.ndarray, settle_steps: int) -> int:
        """Plan the move; returns its length in control steps (ramp plus settling)."""
        distance = float(np.abs(target - start).max())
        ramp = max(1, int(np.ceil(distance / self.speed * self.rate_hz)))
        fractions = np.minimum(np.arange(1, ramp + settle_steps + 1) / ramp, 1.0)[:, None]
        targets = start + fractions * (target - start)
        self.chunk = _normalize_joint(targets).astype(np.float32)
        self.hold = self.chunk[-1:]
        self.requests = 0
        return len(self.chunk)

    def infer(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        self.requests += 1
        return self.chunk if self.requests == 1 else self.hold


def allowed_mask(names: tuple[str, ...]) -> np.ndarray:
    if not names:
        raise ValueError(f"allow_joints: name the joints the arm may move (of {', '.join(JOINT_NAMES)}, or 'all'); "
                         "the others stay where they are")
    if tuple(names) == ("all",):
        return np.ones(len(JOINT_NAMES), bool)
    unknown = [n for n in names if n not in JOINT_NAMES]
    if unknown:
        raise ValueError(f"allow_joints: {unknown[0]!r} is not one of {JOINT_NAMES} (or 'all')")
    return np.array([n in names for n in JOINT_NAMES])


def _capture_robot(args: CaptureArgs, setup):
    if args.robot == "twin":
        twin_setup = load_setup(args.twin_setup) if args.twin_setup else setup
        return make_robot("twin", task="so101-reach", seed=args.seed, setup=twin_setup, frame_scale=1.0)
    specs = lerobot_camera_specs(DeployArgs(lerobot_cameras=args.lerobot_cameras), setup, [args.camera])
    return make_robot("lerobot", port=args.lerobot_port, robot_id=args.lerobot_id, control_rate_hz=setup.control_rate_hz,
                      use_degrees=setup.use_degrees, cameras=specs)


def capture(args: CaptureArgs) -> dict[str, Any]:
    """Move the arm (allowed joints only, through the supervisor) to each calibration pose and photograph it."""
    setup = load_setup(args.setup)
    if args.robot not in ("lerobot", "twin"):
        raise ValueError(f"robot={args.robot!r} is not one of ('lerobot', 'twin')")
    if args.camera not in setup.cameras or setup.cameras[args.camera].mount != "world":
        raise ValueError(f"camera={args.camera!r} is not a world camera of the setup ({', '.join(setup.camera_names)})")
    if not 1 <= args.poses <= len(CALIBRATION_POSES):
        raise ValueError(f"poses={args.poses} must be in [1, {len(CALIBRATION_POSES)}]")
    if Path(args.out).exists() and any(Path(args.out).glob("*.png")):
        raise FileExistsError(f"{args.out} already holds photos; choose a new directory")
    allowed = allowed_mask(args.allow_joints)
    robot = _capture_robot(args, setup)
    robot.connect()
    if hasattr(robot, "frames"):
        robot.frames = False
    bridge = TaskBridge("so101-reach", "joint_pos")
    supervisor = SafetySupervisor(SafetyConfig(), robot.joint_low, robot.joint_high, 1.0 / robot.control_rate_hz,
                                  forward_kinematics=bridge.tcp_position)
    import signal

    previous_usr1 = signal.getsignal(signal.SIGUSR1) if hasattr(signal, "SIGUSR1") else None
    if previous_usr1 is not None:  # kill -USR1 <pid>: the e-stop, as in rlrobot deploy
        supervisor.install_signal_estop(signal.SIGUSR1)
    source = PoseSource(robot.control_rate_hz, args.speed)
    executor = ChunkExecutor(robot, bridge, source, supervisor, ExecutorConfig(mode="open_loop", realtime=args.robot != "twin"))
    settle = max(1, int(round(args.settle_s * robot.control_rate_hz)))
    photos: list[Photo] = []
    try:
        first = np.asarray(robot.observe()["qpos"], np.float64)
        for k, pose in enumerate(CALIBRATION_POSES[: args.poses]):
            target = np.where(allowed, pose, first)  # a joint the user did not allow is held where it was read
            _move(executor, source, robot, target, allowed, settle, f"pose {k + 1}")
            reading = _photo_reading(robot)
            joints = np.mean([robot.observe()["qpos"] for _ in range(READINGS_PER_PHOTO - 1)] + [reading["qpos"]], axis=0)
            photos.append(Photo(np.asarray(reading["images"][args.camera], np.uint8), joints))
            console.print(f"pose {k + 1}/{args.poses}: photo {photos[-1].image.shape[1]}x{photos[-1].image.shape[0]}")
        _move(executor, source, robot, first, allowed, settle, "back to the start")
    finally:
        executor.close()
        robot.disconnect()
        bridge.close()
        if previous_usr1 is not None:
            signal.signal(signal.SIGUSR1, previous_usr1)
    save_photos(args.out, args.camera, photos, profile_units(setup.use_degrees))
    console.print(f"wrote {len(photos)} photos and poses.json to {args.out}; next: rlrobot camera align --setup "
                  f"{args.setup} --photos {args.out}")
    return {"out": args.out, "photos": len(photos), "commands": list(getattr(robot, "commands", []))}


def _photo_reading(robot) -> dict[str, Any]:
    """A reading with the camera's frame (the twin renders frames only when asked: capture's moves need none)."""
    if not hasattr(robot, "frames"):
        return robot.observe()
    robot.frames = True
    try:
        for _ in range(12):  # a delayed reading is older than the first frame: read until one holds a frame
            reading = robot.observe()
            if "images" in reading:
                return reading
        raise RuntimeError("the twin gave no camera frame in 12 readings")
    finally:
        robot.frames = False


def _move(executor, source: PoseSource, robot, target: np.ndarray, allowed: np.ndarray, settle: int, what: str) -> None:
    """One move through the executor: the allowed joints ramp from where they are read to the target; the others are
    commanded their first reading throughout (never a new position, not even the noise of a new reading)."""
    start = np.where(allowed, np.asarray(robot.observe()["qpos"], np.float64), target)
    steps = source.plan(start, target, settle)
    result = executor.run_episode(steps)
    if result.aborted:
        raise RuntimeError(f"camera capture stopped at {what}: {result.abort_reason}; the arm was held and disabled")


# ------------------------------------------------------------------------------------------------------ align
def _camera(setup, name: str | None, photos_camera: str | None) -> str:
    name = name or photos_camera or "front"
    if name not in setup.cameras:
        raise ValueError(f"camera={name!r} is not in the setup ({', '.join(setup.camera_names)})")
    if setup.cameras[name].mount != "world":
        raise ValueError(f"camera={name!r} is a {setup.cameras[name].mount} camera; alignment is for world cameras")
    return name


def _start_pose(setup, name: str):
    cam = setup.cameras[name]
    return CameraPose(np.asarray(cam.position, np.float64), cam.rotation(), float(cam.fovy_deg))


def _model_and_robot():
    import mujoco

    model = mujoco.MjModel.from_xml_path(SO101Env.xml_path)
    return model, scene_parts(model, SO101Env.randomized_geoms).robot


def align(args: AlignArgs) -> dict[str, Any]:
    setup = load_setup(args.setup)
    photos_camera, photos = load_photos(args.photos)
    name = _camera(setup, args.camera, photos_camera)
    cam = setup.cameras[name]
    h, w = photos[0].image.shape[:2]
    if abs(h / w - cam.resolution[0] / cam.resolution[1]) > 0.02:
        raise ValueError(f"the photos are {w}x{h}; camera {name!r} has {cam.resolution[1]}x{cam.resolution[0]} frames")
    model, robot = _model_and_robot()
    result = align_camera(model, photos, _start_pose(setup, name), robot, seed=args.seed)
    pose = result.pose
    cam.position = tuple(float(v) for v in np.round(pose.position, 5))
    cam.quaternion = tuple(float(v) for v in np.round(mat_to_quat(pose.rotation), 6))
    cam.look_at = None
    cam.fovy_deg = round(float(pose.fovy_deg), 3)
    cam.alignment = {"reprojection_error_px": round(result.reprojection_error_px, 3),
                     "initial_error_px": round(result.initial_error_px, 3), "photos": len(photos),
                     "photo_size": [h, w], "seconds": round(result.seconds, 1),
                     "date": datetime.datetime.now().isoformat(timespec="seconds")}
    out = args.out or setup.source
    save_setup(setup, out)
    console.print(f"camera {name!r}: reprojection error {result.reprojection_error_px:.2f} px (was "
                  f"{result.initial_error_px:.2f} px) over {len(photos)} photos {w}x{h}, in {result.seconds:.0f} s; "
                  f"position {np.round(pose.position, 4).tolist()} m, field of view {pose.fovy_deg:.2f} deg; wrote {out}")
    if result.reprojection_error_px > 2.0:
        console.print("[yellow]the error is large: check the overlay (rlrobot camera overlay) and the photos' joints[/]")
    return {"camera": name, "out": out, "pose": pose, "reprojection_error_px": result.reprojection_error_px,
            "initial_error_px": result.initial_error_px, "seconds": result.seconds}


def overlay_command(args: OverlayArgs) -> str:
    import imageio.v3 as iio

    setup = load_setup(args.setup)
    photos_camera, photos = load_photos(args.photos)
    name = _camera(setup, args.camera, photos_camera)
    model, robot = _model_and_robot()
    sheet = overlay(model, photos, _start_pose(setup, name), robot)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    iio.imwrite(args.out, sheet)
    console.print(f"wrote {args.out}: the simulated arm (magenta outline) over {len(photos)} photos from camera {name!r}")
    return args.out


if __name__ == "__main__":
    main(sys.argv[1:])
