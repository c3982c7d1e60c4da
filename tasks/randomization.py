"""Domain randomisation of the SO-101 scene, per episode and seeded, with its ranges from the setup file.

Visual (``CameraPipeline``; drawn per env and episode, applied to the renderer's scene of that env only, so envs
sharing one model still look different): the key light's direction and intensity, the ambient and head light,
shadows on or off; the colours of the robot's parts, the objects and the table, and the table's texture; each
camera's pose and field of view; then on the frames: brightness, contrast, saturation, blur and pixel noise. With a
greenscreen photo for a world camera, every pixel that shows neither the robot nor a task object (the table, the
void) shows the photo instead: a segmentation pass of the same scene decides which.

Physics (``randomize_physics``, a bank of model copies drawn once per task; each env draws one copy per episode):
the objects' friction, mass and the cube's size, the arm's joint damping and armature. The env itself draws the
actuation latency and the observation delay per episode (``tasks/so101.py``).

Every draw comes from the env's seeded generator, so a seed reproduces an episode's images exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mujoco
import numpy as np

from .cameras import FrameRenderer, rotvec_to_mat
from .profile import prepare_frames, render_shape
from .setup import PhysicsRandomization, Setup


@dataclass(frozen=True)
class SceneParts:
    """Which geoms of the model are what, for colouring and for the greenscreen."""

    robot: tuple[int, ...]
    """the arm's geoms (its base and every body below it)"""
    objects: tuple[int, ...]
    """the task's objects (cubes, cylinders): foreground, recoloured by ``colors.objects``"""
    background: tuple[int, ...]
    """geoms the greenscreen photo replaces (the table)"""
    table: int
    table_materials: tuple[int, ...]
    """materials the table's texture is drawn from (``colors.table_textures``)"""
    wrist_body: int
    key_light: int
    """the model light that ``lighting`` moves (the one overhead)"""


def scene_parts(model: mujoco.MjModel, object_geoms: tuple[str, ...], wrist_body: str = "gripper") -> SceneParts:
    base = model.body("base").id
    robot = []
    for g in range(model.ngeom):
        b = int(model.geom_bodyid[g])
        while b not in (0, base):
            b = int(model.body_parentid[b])
        if b == base:
            robot.append(g)
    table = model.geom("table").id
    materials = [model.mat(n).id for n in ("table", "table_checker", "table_gradient", "table_noise", "table_plain")
                 if mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_MATERIAL, n) >= 0]
    lights = [i for i in range(model.nlight) if model.light(i).name == "top"]
    return SceneParts(robot=tuple(robot), objects=tuple(model.geom(n).id for n in object_geoms), background=(table,),
                      table=table, table_materials=tuple(materials), wrist_body=model.body(wrist_body).id,
                      key_light=lights[0] if lights else 0)


def _colour_groups(model: mujoco.MjModel, geoms: tuple[int, ...]) -> np.ndarray:
    """Per geom, the index of its group of equal base colours: parts printed in one colour change together."""
    keys: dict[tuple[float, ...], int] = {}
    return np.array([keys.setdefault(tuple(np.round(model.geom_rgba[g, :3], 3)), len(keys)) for g in geoms], np.int64)


def load_photo(path: str, shape: tuple[int, int]) -> np.ndarray:
    """A greenscreen photo as [H, W, 3] uint8 at ``shape`` (area-resized; the photo must have the frame's aspect)."""
    import imageio.v3 as iio
    from PIL import Image

    try:
        photo = np.asarray(iio.imread(path))
    except (OSError, ValueError) as e:
        raise ValueError(f"greenscreen photo {path!r} cannot be read ({e})") from e
    if photo.ndim == 2:
        photo = np.repeat(photo[..., None], 3, axis=2)
    photo = photo[..., :3].astype(np.uint8)
    h, w = photo.shape[:2]
    if abs(h / w - shape[0] / shape[1]) > 0.02:
        raise ValueError(f"greenscreen photo {path!r} is {w}x{h}; the camera's frames are {shape[1]}x{shape[0]} "
                         "(take the photo with the camera itself)")
    if (h, w) == tuple(shape):
        return photo
    return np.asarray(Image.fromarray(photo).resize((shape[1], shape[0]), Image.Resampling.BOX))


class CameraPipeline:
    """The profile's cameras of a batch of envs: per-episode visual draws, rendering in the worker threads, the
    greenscreen, then ``prepare_frames`` and the frame-level randomisation.

    ``render_env`` draws env i's cameras into ``raw[c][i]`` (each camera at its ``render_shapes[c]``, whose crop is
    exactly ``image_size`` square); ``finish`` turns the raw batch into the observation frames. ``render_full``
    renders one camera of one env at the real camera's resolution through the same randomisation (the twin's frames,
    which then go through ``prepare_frames`` like a real camera's)."""

    def __init__(self, setup: Setup, model: mujoco.MjModel, parts: SceneParts, num_envs: int):
        self.setup, self.parts, self.num_envs = setup, parts, num_envs
        self.names = setup.camera_names
        self.size = setup.image_size
        cams = [setup.cameras[n] for n in self.names]
        self.mounts = [c.mount for c in cams]
        self.crops = [c.crop_fractions() for c in cams]
        self.resolutions = [tuple(c.resolution) for c in cams]
        self.render_shapes = [render_shape(self.size, c.resolution, crop) for c, crop in zip(cams, self.crops, strict=True)]
        self.positions = np.array([c.position for c in cams], np.float64).reshape(-1, 3)
        self.rotations = np.array([c.rotation() for c in cams], np.float64).reshape(-1, 3, 3)
        self.fovy = np.array([c.fovy_deg for c in cams], np.float64)
        r = setup.randomization
        self.greenscreen = [c.greenscreen if (r.greenscreen and c.greenscreen and c.mount == "world") else None for c in cams]
        self._photos_small = [load_photo(p, s) if p else None for p, s in zip(self.greenscreen, self.render_shapes, strict=True)]
        self._photos_full: dict[int, np.ndarray] = {}
        self.shadows = r.lighting.shadow_probability > 0
        self.robot_groups = _colour_groups(model, parts.robot)
        self.base_rgba = model.geom_rgba.copy()
        self.background = np.zeros(model.ngeom + 1, bool)  # index geom id + 1 (-1: no geom)
        self.background[0] = True
        self.background[np.asarray(parts.background) + 1] = True
        key = parts.key_light
        self.key_diffuse = float(model.light_diffuse[key, 0]) if model.nlight else 0.0
        n, c = num_envs, len(self.names)
        # the per-episode draws (what get_state saves)
        self.draws: dict[str, np.ndarray] = {
            "light_dir": np.tile([0.0, 0.0, -1.0], (n, 1)),
            "light_diffuse": np.full(n, self.key_diffuse),
            "ambient": np.full(n, float(model.vis.headlight.ambient[0])),
            "headlight": np.full(n, float(model.vis.headlight.diffuse[0])),
            "shadows": np.zeros(n, bool),
            "robot_rgb": np.zeros((n, int(self.robot_groups.max(initial=-1)) + 1, 3)),
            "object_rgb": np.zeros((n, len(parts.objects), 3)),
            "table_rgb": np.zeros((n, 3)),
            "table_material": np.full(n, -1, np.int64),
            "cam_dpos": np.zeros((n, c, 3)),
            "cam_drot": np.zeros((n, c, 3)),
            "cam_dfovy": np.zeros((n, c)),
            "brightness": np.ones((n, c)),
            "contrast": np.ones((n, c)),
            "saturation": np.ones((n, c)),
            "blur": np.zeros((n, c), bool),
        }

    # ---------------------------------------------------------------------------------------------- draws
    def draw(self, ids: np.ndarray, rng: np.random.Generator) -> None:
        """New visual draws for envs ``ids`` (a new episode)."""
        r = self.setup.randomization
        k = len(ids)
        d = self.draws
        light = r.lighting
        tilt = np.radians(rng.uniform(0.0, light.direction_deg, k))
        azimuth = rng.uniform(0.0, 2 * np.pi, k)
        d["light_dir"][ids] = np.stack([np.sin(tilt) * np.cos(azimuth), np.sin(tilt) * np.sin(azimuth), -np.cos(tilt)], 1)
        d["light_diffuse"][ids] = rng.uniform(*light.diffuse, k)
        d["ambient"][ids] = rng.uniform(*light.ambient, k)
        d["headlight"][ids] = rng.uniform(*light.headlight, k)
        d["shadows"][ids] = rng.random(k) < light.shadow_probability
        colors = r.colors
        d["robot_rgb"][ids] = rng.uniform(-colors.robot, colors.robot, d["robot_rgb"][ids].shape)
        d["object_rgb"][ids] = rng.uniform(-colors.objects, colors.objects, d["object_rgb"][ids].shape)
        d["table_rgb"][ids] = rng.uniform(-colors.table, colors.table, (k, 3))
        materials = self.parts.table_materials
        d["table_material"][ids] = rng.choice(materials, k) if colors.table_textures and materials else -1
        cam = r.camera
        c = len(self.names)
        d["cam_dpos"][ids] = rng.uniform(-cam.position_m, cam.position_m, (k, c, 3))
        d["cam_drot"][ids] = np.radians(rng.uniform(-cam.rotation_deg, cam.rotation_deg, (k, c, 3)))
        d["cam_dfovy"][ids] = rng.uniform(-cam.fovy_deg, cam.fovy_deg, (k, c))
        image = r.image
        d["brightness"][ids] = 1.0 + rng.uniform(-image.brightness, image.brightness, (k, c))
        d["contrast"][ids] = 1.0 + rng.uniform(-image.contrast, image.contrast, (k, c))
        d["saturation"][ids] = 1.0 + rng.uniform(-image.saturation, image.saturation, (k, c))
        d["blur"][ids] = rng.random((k, c)) < image.blur_probability

    def get_state(self) -> dict[str, np.ndarray]:
        return {k: v.copy() for k, v in self.draws.items()}

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        for k, v in state.items():
            self.draws[k][:] = v

    # ---------------------------------------------------------------------------------------------- poses
    def camera_pose(self, i: int, c: int, data: mujoco.MjData) -> tuple[np.ndarray, np.ndarray, float]:
        """World position, rotation and fovy of env i's camera c this frame (its nominal pose, jittered)."""
        d = self.draws
        pos = self.positions[c] + d["cam_dpos"][i, c]
        rot = self.rotations[c] @ rotvec_to_mat(d["cam_drot"][i, c])
        if self.mounts[c] == "wrist":
            body = self.parts.wrist_body
            frame = data.xmat[body].reshape(3, 3)
            pos, rot = data.xpos[body] + frame @ pos, frame @ rot
        return pos, rot, float(self.fovy[c] + d["cam_dfovy"][i, c])

    # ---------------------------------------------------------------------------------------------- rendering
    def make_renderer(self, model: mujoco.MjModel, full_scale: float | None = None) -> FrameRenderer:
        """A renderer for this pipeline's training frames, or (``full_scale``) for ``render_full`` at that scale."""
        shapes = self.render_shapes if full_scale is None else [self.frame_shape(c, full_scale) for c in range(len(self.names))]
        return FrameRenderer(model, max(s[0] for s in shapes), max(s[1] for s in shapes), shadows=self.shadows)

    def _style_scene(self, renderer: FrameRenderer, i: int) -> None:
        """Env i's lights and colours on the renderer's current scene."""
        d = self.draws
        scene = renderer.scene
        ambient, headlight = d["ambient"][i], d["headlight"][i]
        for k in range(scene.nlight):
            light = scene.lights[k]
            if light.headlight:
                light.ambient[:] = ambient
                light.diffuse[:] = headlight
            else:  # the overhead key light (the scene's only other light)
                light.dir[:] = d["light_dir"][i]
                light.diffuse[:] = d["light_diffuse"][i]
                light.castshadow = bool(d["shadows"][i])
        robot = {g: k for k, g in enumerate(self.parts.robot)}
        objects = {g: k for k, g in enumerate(self.parts.objects)}
        table, material = self.parts.table, int(d["table_material"][i])
        for g in renderer.geoms:
            if g.objtype != mujoco.mjtObj.mjOBJ_GEOM:
                continue
            gid = g.objid
            if gid in robot:
                g.rgba[:3] = np.clip(self.base_rgba[gid, :3] + d["robot_rgb"][i, self.robot_groups[robot[gid]]], 0.02, 1.0)
            elif gid in objects:
                g.rgba[:3] = np.clip(self.base_rgba[gid, :3] + d["object_rgb"][i, objects[gid]], 0.02, 1.0)
            elif gid == table:
                if material >= 0:
                    g.matid = material
                g.rgba[:3] = np.clip(1.0 + d["table_rgb"][i], 0.05, 1.0) if material >= 0 else \
                    np.clip(np.asarray(g.rgba[:3]) + d["table_rgb"][i], 0.05, 1.0)

    def _draw_camera(self, renderer: FrameRenderer, i: int, c: int, data: mujoco.MjData, shape: tuple[int, int],
                     photo: np.ndarray | None, out: np.ndarray) -> None:
        renderer.set_camera(*self.camera_pose(i, c, data))
        renderer.render_rgb(shape[0], shape[1], out=out)
        if photo is not None:
            ids = renderer.render_geom_ids(shape[0], shape[1])
            mask = self.background[ids + 1]
            out[mask] = photo[mask]

    def render_env(self, renderer: FrameRenderer, i: int, model: mujoco.MjModel, data: mujoco.MjData,
                   raw: list[np.ndarray]) -> None:
        """Env i's cameras into ``raw[c][i]`` (runs in a worker thread with that thread's renderer)."""
        renderer.update(model, data)
        self._style_scene(renderer, i)
        for c, shape in enumerate(self.render_shapes):
            self._draw_camera(renderer, i, c, data, shape, self._photos_small[c], raw[c][i])

    def finish(self, raw: list[np.ndarray], rng: np.random.Generator, ids: np.ndarray | None = None) -> np.ndarray:
        """[N, C, S, S, 3] uint8 observation frames from the raw renders of envs ``ids`` (default all)."""
        ids = np.arange(self.num_envs) if ids is None else ids
        out = np.empty((len(ids), len(self.names), self.size, self.size, 3), np.uint8)
        for c in range(len(self.names)):
            frames = prepare_frames(raw[c][ids], self.crops[c], self.size)
            out[:, c] = self.image_effects(frames, ids, c, rng)
        return out

    def image_effects(self, frames: np.ndarray, ids: np.ndarray, c: int, rng: np.random.Generator) -> np.ndarray:
        """Saturation, contrast, brightness, blur and noise of camera c's frames of envs ``ids`` ([k, H, W, 3]), in
        float32 and in place (each effect a pass or two over the frames; an effect whose range is 0 costs nothing)."""
        image = self.setup.randomization.image
        d = self.draws
        if not (image.brightness or image.contrast or image.saturation or image.blur_probability or image.noise_std):
            return frames
        x = frames.astype(np.float32)

        def per_frame(key: str) -> np.ndarray:
            return d[key][ids, c].astype(np.float32)[:, None, None, None]

        if image.saturation:  # towards or away from each pixel's grey, which keeps the frame's mean
            gray = (x[..., 0] + x[..., 1] + x[..., 2])[..., None] * np.float32(1 / 3)  # 10x a mean over 3 channels
            x -= gray
            x *= per_frame("saturation")
            x += gray
        if image.contrast or image.brightness:  # b * (mean + c * (x - mean))
            mean = x.mean(axis=(1, 2, 3), keepdims=True)
            brightness = per_frame("brightness")
            x -= mean
            x *= per_frame("contrast") * brightness
            x += mean * brightness
        blur = d["blur"][ids, c]
        if blur.any():
            x[blur] = box_blur(x[blur])
        if image.noise_std:  # uniform of the given std: a quarter of the cost of Gaussian draws, as good a blur of pixels
            noise = rng.random(x.shape, dtype=np.float32)
            noise -= np.float32(0.5)
            noise *= np.float32(image.noise_std * 12**0.5)
            x += noise
        np.clip(x, 0, 255, out=x)
        np.rint(x, out=x)
        return x.astype(np.uint8)

    def frame_shape(self, c: int, scale: float) -> tuple[int, int]:
        """Camera c's frame size at ``scale`` of its resolution (same aspect ratio and field of view)."""
        h, w = self.resolutions[c]
        return max(self.size, round(h * scale)), max(self.size, round(w * scale))

    def render_full(self, renderer: FrameRenderer, i: int, c: int, model: mujoco.MjModel, data: mujoco.MjData,
                    rng: np.random.Generator, scale: float = 1.0) -> np.ndarray:
        """Env i's camera c as a real camera's frame (its resolution times ``scale``), randomised like training
        frames: what the blind twin reports, which ``prepare_frames`` then crops and resizes like a real frame. The
        frame-level effects act on its pixels as on a training frame's (after the area resize the pixel noise is
        weaker than in training, as a real camera's is)."""
        shape = self.frame_shape(c, scale)
        if self.greenscreen[c] and self._photos_full.get(c, np.empty((0, 0))).shape[:2] != shape:
            self._photos_full[c] = load_photo(self.greenscreen[c], shape)
        renderer.update(model, data)
        self._style_scene(renderer, i)
        out = np.empty((*shape, 3), np.uint8)
        self._draw_camera(renderer, i, c, data, shape, self._photos_full.get(c), out)
        return self.image_effects(out[None], np.array([i]), c, rng)[0]


def box_blur(x: np.ndarray) -> np.ndarray:
    """3x3 box blur of [k, H, W, 3] float frames (edges replicated)."""
    padded = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)), mode="edge")
    h, w = x.shape[1:3]
    return sum(padded[:, dy:dy + h, dx:dx + w] for dy in range(3) for dx in range(3)) / 9.0


# -------------------------------------------------------------------------------------------------- physics
def randomize_physics(model: mujoco.MjModel, rng: np.random.Generator, ranges: PhysicsRandomization,
                      object_geoms: tuple[int, ...], object_bodies: tuple[int, ...], sized_geoms: tuple[int, ...],
                      arm_dofs: tuple[int, ...]) -> dict[str, Any]:
    """Scale one model copy's physics in place by draws from ``ranges``; returns the draws (for tests and logs)."""
    friction = rng.uniform(*ranges.friction)
    mass = rng.uniform(*ranges.object_mass)
    size = rng.uniform(*ranges.object_size)
    damping = rng.uniform(*ranges.joint_damping)
    armature = rng.uniform(*ranges.joint_armature)
    for g in object_geoms:
        model.geom_friction[g, 0] *= friction
    for b in object_bodies:  # size and mass are drawn apart; the inertia follows both (m L^2)
        sized = any(model.geom_bodyid[g] == b for g in sized_geoms)
        model.body_mass[b] *= mass
        model.body_inertia[b] *= mass * (size ** 2 if sized else 1.0)
    for g in sized_geoms:
        model.geom_size[g] *= size
        model.geom_rbound[g] *= size  # the broad phase's bounding sphere and box follow the size
        model.geom_aabb[g] *= size
    dofs = np.asarray(arm_dofs, np.int64)
    model.dof_damping[dofs] *= damping
    model.dof_armature[dofs] *= armature
    return {"friction": friction, "mass": mass, "size": size, "damping": damping, "armature": armature}


def latency_draws(rng: np.random.Generator, low_high: tuple[int, int], k: int) -> np.ndarray:
    low, high = low_high
    return rng.integers(low, high + 1, k) if high > low else np.full(k, low, np.int64)

