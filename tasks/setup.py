"""The setup file: the physical setup of one SO-101 station (cameras, robot on the table, spawn regions,
randomisation ranges), read by the tasks (``--setup FILE``), ``rlrobot deploy``, the twin and ``rlrobot camera``.

A JSON (or YAML, with PyYAML installed) file; every field is optional and defaults to the simulated scene as shipped
(``tasks/assets/setups/so101_default.json`` is a complete example). Lengths in metres, angles in degrees, in the
robot base frame (x forward, z up, origin at the base's foot on the table) unless a field says otherwise::

    {
      "version": 1,
      "control_rate_hz": 30,           # LeRobot datasets are recorded at 30 fps
      "image_size": 64,                # the side of the square images a policy sees (prepare_frames)
      "use_degrees": true,             # the follower's use_degrees: degrees (true) or -100..100 (false)
      "robot": {"base_on_table": [-0.2, 0.0], "base_yaw_deg": 0.0},
      "table": {"size": [0.9, 0.9]},
      "cameras": {
        "front": {"mount": "world", "position": [0.62, 0.0, 0.36], "look_at": [0.2, 0.0, 0.11],
                  "fovy_deg": 55, "resolution": [480, 640], "greenscreen": "background.png"},
        "wrist": {"mount": "wrist", "position": [0.01, 0.0, 0.035], "look_at": [0.1, 0.0, -0.02],
                  "up": [1, 0, 0], "fovy_deg": 70, "resolution": [480, 640]}
      },
      "spawn": {"cube": {"center": [0.165, 0.0], "half_size": [0.035, 0.08], "yaw_deg": [-45, 45]}},
      "randomization": {"lighting": {...}, "colors": {...}, "camera": {...}, "image": {...}, "physics": {...}}
    }

Cameras: ``mount`` ``world`` (pose in the robot base frame) or ``wrist`` (pose in the frame of the ``gripper`` body,
which turns with ``wrist_roll``); the pose is ``position`` plus either ``look_at`` (and ``up``, default +z) or
``quaternion`` (w, x, y, z of the camera frame in MuJoCo's convention: the camera looks along its -z axis, +y up).
``fovy_deg``: the vertical field of view of the full frame; ``resolution``: [height, width] of the real camera's
frames; ``crop``: [top, left, height, width] fractions of the frame that the policy sees (default: the centred
square); ``greenscreen``: a photo of the real scene from this camera (a path relative to the setup file): with
``randomization.greenscreen`` on, every simulated pixel that is not robot or object shows it (world cameras only);
``device``: the camera's index or path for LeRobot (``--lerobot-cameras`` overrides it); ``alignment`` is written by
``rlrobot camera align`` (reprojection error, photos used). ``robot.base_on_table``: where the robot base stands,
measured from the table top's centre; ``base_yaw_deg``: the robot's heading against the table's x axis.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import numpy as np

from rlrobot.domains import Domain, Finite, NonNegative, NonNegativeInt, Positive, PositiveInt, UnitInterval, check_domains

from .profile import centred_square

ASSETS = Path(__file__).parent / "assets"
DEFAULT_SETUP = ASSETS / "setups" / "so101_default.json"
SETUP_VERSION = 1
MOUNTS = ("world", "wrist")
WRIST_BODY = "gripper"
"""the body a wrist camera is fixed to"""
FieldOfView = Annotated[float, Domain(low=1.0, high=170.0)]
ControlRate = Annotated[float, Domain(low=1.0, high=200.0)]
Fraction = Annotated[float, Domain(low=0.0, high=1.0)]


@dataclass
class CameraSetup:
    mount: str = "world"
    """world (pose in the robot base frame) | wrist (pose in the gripper body's frame)"""
    position: tuple[Finite, Finite, Finite] = (0.62, 0.0, 0.36)
    look_at: tuple[Finite, Finite, Finite] | None = None
    up: tuple[Finite, Finite, Finite] = (0.0, 0.0, 1.0)
    quaternion: tuple[Finite, Finite, Finite, Finite] | None = None
    """w, x, y, z of the camera frame (MuJoCo: looks along -z, +y up); give this or look_at"""
    fovy_deg: FieldOfView = 55.0
    resolution: tuple[PositiveInt, PositiveInt] = (480, 640)
    """[height, width] of the real camera's frames"""
    fps: PositiveInt = 30
    """the real camera's frame rate (LeRobot's camera config)"""
    crop: tuple[Fraction, Fraction, Fraction, Fraction] | None = None
    """[top, left, height, width] fractions of the frame the policy sees (None: the centred square)"""
    greenscreen: str | None = None
    """a photo of the real scene from this camera (world cameras): the background of the simulated frames"""
    device: str | None = None
    """LeRobot camera index or path (e.g. 0 or /dev/video2)"""
    alignment: dict[str, Any] | None = None
    """written by ``rlrobot camera align``"""

    def crop_fractions(self) -> tuple[float, float, float, float]:
        return tuple(self.crop) if self.crop is not None else centred_square(*self.resolution)

    def rotation(self) -> np.ndarray:
        """3x3 rotation of the camera frame (columns: its x, y, z axes; it looks along -z) in its mount's frame."""
        from .cameras import look_at_rotation, quat_to_mat

        if self.quaternion is not None:
            return quat_to_mat(np.asarray(self.quaternion, np.float64))
        return look_at_rotation(np.asarray(self.position), np.asarray(self.look_at), np.asarray(self.up))


@dataclass
class RobotPlacement:
    base_on_table: tuple[Finite, Finite] = (-0.2, 0.0)
    """the robot base's position from the table top's centre (m)"""
    base_yaw_deg: Finite = 0.0
    """the robot's heading against the table's x axis"""


@dataclass
class TableSetup:
    size: tuple[Positive, Positive] = (0.9, 0.9)
    """the table top's length (x) and width (y), m"""


@dataclass
class SpawnRegion:
    center: tuple[Finite, Finite] = (0.165, 0.0)
    half_size: tuple[NonNegative, NonNegative] = (0.035, 0.08)
    yaw_deg: tuple[Finite, Finite] = (-45.0, 45.0)


@dataclass
class TargetRegion:
    center: tuple[Finite, Finite, Finite] = (0.17, 0.0, 0.075)
    half_size: tuple[NonNegative, NonNegative, NonNegative] = (0.05, 0.12, 0.045)


@dataclass
class SpawnSetup:
    cube: SpawnRegion | None = None
    """so101-push / so101-lift: where the cube starts (None: the task's own sector)"""
    target: TargetRegion | None = None
    """so101-reach: the box the target is drawn in (None: the task's own)"""


@dataclass
class LightingRandomization:
    direction_deg: NonNegative = 0.0
    """the key light's direction tilts by up to this angle from straight down"""
    diffuse: tuple[NonNegative, NonNegative] = (0.6, 0.6)
    """the key light's intensity"""
    ambient: tuple[NonNegative, NonNegative] = (0.45, 0.45)
    """the ambient light (the head light's ambient term)"""
    headlight: tuple[NonNegative, NonNegative] = (0.5, 0.5)
    """the head light's diffuse intensity"""
    shadow_probability: UnitInterval = 0.0
    """chance per episode that the key light casts shadows (rendering shadows on a CPU costs about 10x)"""


@dataclass
class ColorRandomization:
    robot: UnitInterval = 0.0
    """each robot part's colour moves by up to this much per channel (0..1)"""
    objects: UnitInterval = 0.0
    table: UnitInterval = 0.0
    table_textures: bool = False
    """draw the table's texture from the scene's textures (checker, wood-like gradient, plain, noise)"""


@dataclass
class CameraRandomization:
    position_m: NonNegative = 0.0
    """each camera's position moves by up to this much per axis"""
    rotation_deg: NonNegative = 0.0
    """each camera turns by up to this angle about each of its axes"""
    fovy_deg: NonNegative = 0.0


@dataclass
class ImageRandomization:
    noise_std: NonNegative = 0.0
    """pixel noise of this std (uniform, independent per pixel and channel), in 0..255 units"""
    blur_probability: UnitInterval = 0.0
    """chance per episode that a camera's frames are blurred (3x3 box)"""
    brightness: UnitInterval = 0.0
    """relative brightness change, up to +-"""
    contrast: UnitInterval = 0.0
    saturation: UnitInterval = 0.0


@dataclass
class PhysicsRandomization:
    friction: tuple[Positive, Positive] = (0.8, 1.2)
    """scale of the objects' sliding friction"""
    object_mass: tuple[Positive, Positive] = (0.7, 1.3)
    object_size: tuple[Positive, Positive] = (1.0, 1.0)
    """scale of the cube's size (so101-push / so101-lift)"""
    joint_damping: tuple[Positive, Positive] = (1.0, 1.0)
    joint_armature: tuple[Positive, Positive] = (1.0, 1.0)
    actuation_latency_steps: tuple[NonNegativeInt, NonNegativeInt] = (0, 0)
    """commands reach the servos this many control steps late (drawn per episode)"""
    observation_delay_steps: tuple[NonNegativeInt, NonNegativeInt] = (0, 0)
    """the profile's readings and frames are this many control steps old (drawn per episode)"""
    bank_size: PositiveInt = 16
    """model copies the physics draws come from (one per episode and env)"""


@dataclass
class Randomization:
    lighting: LightingRandomization = field(default_factory=LightingRandomization)
    colors: ColorRandomization = field(default_factory=ColorRandomization)
    camera: CameraRandomization = field(default_factory=CameraRandomization)
    image: ImageRandomization = field(default_factory=ImageRandomization)
    physics: PhysicsRandomization = field(default_factory=PhysicsRandomization)
    joint_noise_deg: NonNegative = 0.0
    """Gaussian noise on the profile's joint readings (degrees; the gripper's 0..100 gets the same number)"""
    greenscreen: bool = True
    """composite each world camera's greenscreen photo behind the robot and objects"""


@dataclass
class Setup:
    version: PositiveInt = SETUP_VERSION
    control_rate_hz: ControlRate = 30.0
    image_size: PositiveInt = 64
    use_degrees: bool = True
    robot: RobotPlacement = field(default_factory=RobotPlacement)
    table: TableSetup = field(default_factory=TableSetup)
    cameras: dict[str, CameraSetup] = field(default_factory=dict)
    spawn: SpawnSetup = field(default_factory=SpawnSetup)
    randomization: Randomization = field(default_factory=Randomization)
    source: str = ""
    """the file it was read from ('' for an inline setup); not written"""

    def validate(self) -> None:
        """One-line ValueError naming the field and its allowed values (before any compute)."""
        check_domains(self, "setup.")
        if self.version != SETUP_VERSION:
            raise ValueError(f"setup.version={self.version} is not a version this code reads ({SETUP_VERSION})")
        if not 8 <= self.image_size <= 512:
            raise ValueError(f"setup.image_size={self.image_size} must be in [8, 512] pixels")
        for name, cam in self.cameras.items():
            _check_camera(name, cam)
        for path, value in _ranges(self, "setup"):
            if value[0] > value[1]:
                raise ValueError(f"{path}={list(value)} must be [low, high] with low <= high")
        r = self.randomization
        if r.lighting.direction_deg > 90:
            raise ValueError(f"setup.randomization.lighting.direction_deg={r.lighting.direction_deg} must be in [0, 90]")
        if r.camera.rotation_deg > 45 or r.camera.fovy_deg > 45 or r.camera.position_m > 0.5:
            raise ValueError("setup.randomization.camera: position_m must be <= 0.5, rotation_deg and fovy_deg <= 45")
        if r.physics.actuation_latency_steps[1] > 10 or r.physics.observation_delay_steps[1] > 10:
            raise ValueError("setup.randomization.physics: actuation_latency_steps and observation_delay_steps must be "
                             "within [0, 10] control steps")

    @property
    def camera_names(self) -> tuple[str, ...]:
        return tuple(self.cameras)

    def to_dict(self) -> dict[str, Any]:
        out = _to_plain(self)
        out.pop("source", None)
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=False)


def _check_camera(name: str, cam: CameraSetup) -> None:
    where = f"setup.cameras.{name}"
    check_domains(cam, f"{where}.")
    if not name.isidentifier():
        raise ValueError(f"{where}: a camera name must be letters, digits and _ (it becomes the key image_{name} and the "
                         f"feature observation.images.{name})")
    if cam.mount not in MOUNTS:
        raise ValueError(f"{where}.mount={cam.mount!r} is not one of {MOUNTS}")
    if (cam.look_at is None) == (cam.quaternion is None):
        raise ValueError(f"{where}: give exactly one of look_at or quaternion")
    if cam.quaternion is not None and not math.isclose(float(np.linalg.norm(cam.quaternion)), 1.0, abs_tol=1e-3):
        raise ValueError(f"{where}.quaternion={list(cam.quaternion)} must have unit norm")
    if cam.look_at is not None:
        forward = np.asarray(cam.look_at, float) - np.asarray(cam.position, float)
        if np.linalg.norm(forward) < 1e-6:
            raise ValueError(f"{where}.look_at must differ from position")
        if np.linalg.norm(np.cross(forward, np.asarray(cam.up, float))) < 1e-6 * np.linalg.norm(forward):
            raise ValueError(f"{where}.up={list(cam.up)} must not be parallel to the viewing direction")
    if cam.crop is not None:
        top, left, h, w = cam.crop
        if h <= 0 or w <= 0 or top + h > 1 + 1e-9 or left + w > 1 + 1e-9:
            raise ValueError(f"{where}.crop={list(cam.crop)} must be [top, left, height, width] fractions inside the frame")
    if cam.greenscreen is not None and cam.mount != "world":
        raise ValueError(f"{where}.greenscreen is for world cameras (a wrist camera's background moves with the arm)")
    if max(cam.resolution) > 4096:
        raise ValueError(f"{where}.resolution={list(cam.resolution)} must be at most 4096 pixels a side")


def _ranges(obj: Any, prefix: str):
    """(dotted path, value) of every [low, high] range field of the setup's randomisation and spawn sections."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        path = f"{prefix}.{f.name}"
        if dataclasses.is_dataclass(value):
            yield from _ranges(value, path)
        elif f.name in ("diffuse", "ambient", "headlight", "friction", "object_mass", "object_size", "joint_damping",
                        "joint_armature", "actuation_latency_steps", "observation_delay_steps", "yaw_deg"):
            yield path, value


def _to_plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {f.name: _to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: _to_plain(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_to_plain(v) for v in value]
    return value


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, include_extras=True)


def _from_plain(cls: type, data: Any, path: str) -> Any:
    """A setup dataclass from parsed JSON: unknown keys and wrong kinds refused in one line naming the field."""
    if not isinstance(data, dict):
        raise ValueError(f"{path} must be a mapping of fields, got {type(data).__name__}")
    known = {f.name: f for f in dataclasses.fields(cls) if f.name != "source"}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ValueError(f"{path}: unknown field {unknown[0]!r} (allowed: {', '.join(known)})")
    hints = _hints(cls)
    kwargs = {}
    for name, value in data.items():
        kwargs[name] = _convert(hints[name], value, f"{path}.{name}")
    return cls(**kwargs)


def _convert(hint: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(hint)
    if origin is Annotated:
        return _convert(typing.get_args(hint)[0], value, path)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None:
            return None
        return _convert(args[0], value, path)
    if dataclasses.is_dataclass(hint):
        return _from_plain(hint, value, path)
    if origin is dict:
        value_type = typing.get_args(hint)[1]
        if not isinstance(value, dict):
            raise ValueError(f"{path} must be a mapping, got {type(value).__name__}")
        if value_type is Any:
            return dict(value)
        return {str(k): _convert(value_type, v, f"{path}.{k}") for k, v in value.items()}
    if origin is tuple:
        args = [a for a in typing.get_args(hint) if a is not Ellipsis]
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise ValueError(f"{path} must be a list of {len(args)} numbers, got {value!r}")
        return tuple(_convert(a, v, f"{path}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True)))
    if hint is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{path} must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{path} must be an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"{path} must be a finite number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, (str, int)) or isinstance(value, bool):
            raise ValueError(f"{path} must be a string, got {value!r}")
        return str(value)
    return value


def setup_from_dict(data: dict[str, Any], source: str = "") -> Setup:
    setup = _from_plain(Setup, data, "setup")
    setup.source = source
    if source:  # photos are named relative to the setup file
        base = Path(source).parent
        for cam in setup.cameras.values():
            if cam.greenscreen is not None and not Path(cam.greenscreen).is_absolute():
                cam.greenscreen = str((base / cam.greenscreen).resolve())
    setup.validate()
    return setup


def _parse(text: str, path: str) -> dict[str, Any]:
    if path.endswith((".yaml", ".yml")):
        try:
            import yaml
        except ImportError as e:
            raise ImportError(f"setup {path}: reading YAML needs PyYAML (pip install pyyaml), or write the setup as JSON") from e
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ValueError(f"setup {path} is not valid YAML: {str(e).splitlines()[0]}") from e
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"setup {path} is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise ValueError(f"setup {path} must hold a mapping of fields")
    return data


def load_setup(setup: str | Path | dict[str, Any] | Setup | None = None) -> Setup:
    """A validated setup from a file path, an inline JSON text (what a run's config keeps), a parsed dict or a Setup;
    None: the shipped default (``tasks/assets/setups/so101_default.json``)."""
    if isinstance(setup, Setup):
        setup.validate()
        return setup
    if isinstance(setup, dict):
        return setup_from_dict(setup)
    if setup is None or setup == "":
        setup = DEFAULT_SETUP
    text = str(setup)
    if text.lstrip().startswith("{"):
        return setup_from_dict(_parse(text, "<inline>"))
    path = Path(text)
    if not path.is_file():
        raise FileNotFoundError(f"setup file {text!r} does not exist")
    return setup_from_dict(_parse(path.read_text(), str(path)), source=str(path.resolve()))


def setup_text(setup: str | Path) -> str:
    """The setup as self-contained JSON (photo paths made absolute): what a run's config keeps of ``--setup FILE``,
    so that a checkpoint rebuilds its scene without the file."""
    return load_setup(setup).to_json()


def save_setup(setup: Setup, path: str | Path) -> None:
    """Write the setup (JSON, or YAML for a .yaml / .yml path), atomically; photo paths relative to the file."""
    path = Path(path)
    data = setup.to_dict()
    for cam in data["cameras"].values():
        photo = cam.get("greenscreen")
        if photo:
            try:
                cam["greenscreen"] = str(Path(photo).resolve().relative_to(path.resolve().parent))
            except ValueError:
                pass
    if path.suffix in (".yaml", ".yml"):
        import yaml

        text = yaml.safe_dump(data, sort_keys=False)
    else:
        text = json.dumps(data, indent=2) + "\n"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def check_setup_option(task: str, setup: str, obs_mode: str) -> None:
    """What ``TrainConfig.validate`` asks of ``--setup``: an SO-101 task and a readable, valid setup."""
    if not setup:
        return
    from rlrobot.tasks.registry import task_spec

    from .so101 import SO101Env

    if ":" in task or not (isinstance(task_spec(task).entry_point, type) and issubclass(task_spec(task).entry_point, SO101Env)):
        raise ValueError(f"setup applies to the SO-101 tasks (so101-*), not task={task!r}")
    load_setup(setup)
