"""Cameras as configuration: poses from the setup file, and a renderer whose scene each env may change before it draws.

A camera frame here is MuJoCo's: the camera looks along its -z axis with +y up, a rotation's columns are its x, y, z
axes. ``FrameRenderer`` owns its OpenGL context and scene (one per thread: a context is current in one thread only)
and exposes the three steps the randomisation needs between them: ``update`` (the scene of one env's model and
data), changes to that scene (camera pose and field of view, lights, colours, textures), then ``render_rgb`` and
``render_geom_ids`` (a segmentation pass of the same scene, for the greenscreen).
"""

from __future__ import annotations

import math

import mujoco
import numpy as np


# ------------------------------------------------------------------------------------------------- pose math
def look_at_rotation(position: np.ndarray, target: np.ndarray, up: np.ndarray) -> np.ndarray:
    """The camera frame (columns x, y, z; looking along -z) at ``position`` looking at ``target`` with ``up`` up."""
    forward = np.asarray(target, np.float64) - np.asarray(position, np.float64)
    forward /= np.linalg.norm(forward)
    right = np.cross(forward, np.asarray(up, np.float64))
    right /= np.linalg.norm(right)
    z = -forward
    y = np.cross(z, right)
    return np.stack([right, y, z], axis=1)


def quat_to_mat(quat: np.ndarray) -> np.ndarray:
    out = np.zeros(9)
    q = np.asarray(quat, np.float64)
    mujoco.mju_quat2Mat(out, q / np.linalg.norm(q))
    return out.reshape(3, 3)


def mat_to_quat(mat: np.ndarray) -> np.ndarray:
    out = np.zeros(4)
    mujoco.mju_mat2Quat(out, np.asarray(mat, np.float64).reshape(9))
    return out * (1.0 if out[0] >= 0 else -1.0)  # w >= 0: one of the two quaternions of a rotation


def rotvec_to_mat(rotvec: np.ndarray) -> np.ndarray:
    """Rodrigues: the rotation of ``|rotvec|`` radians about ``rotvec``."""
    v = np.asarray(rotvec, np.float64)
    angle = float(np.linalg.norm(v))
    if angle < 1e-12:
        return np.eye(3)
    k = v / angle
    kx = np.array([[0, -k[2], k[1]], [k[2], 0, -k[0]], [-k[1], k[0], 0]])
    return np.eye(3) + math.sin(angle) * kx + (1 - math.cos(angle)) * kx @ kx


def mat_to_rotvec(mat: np.ndarray) -> np.ndarray:
    quat = mat_to_quat(mat)
    angle = 2.0 * math.atan2(float(np.linalg.norm(quat[1:])), float(quat[0]))
    axis = quat[1:] / max(float(np.linalg.norm(quat[1:])), 1e-12)
    return axis * angle


def rotation_angle_deg(a: np.ndarray, b: np.ndarray) -> float:
    """The angle of the rotation between two camera frames, degrees."""
    cos = (np.trace(np.asarray(a).T @ np.asarray(b)) - 1.0) / 2.0
    return math.degrees(math.acos(float(np.clip(cos, -1.0, 1.0))))


# ------------------------------------------------------------------------------------------------- renderer
class FrameRenderer:
    """Off-screen renderer of MuJoCo scenes, up to ``max_height`` x ``max_width`` pixels per frame.

    ``model`` sizes the context (textures, materials, framebuffer); any model of the same structure (a copy in a
    randomisation bank) may be drawn with ``update``. ``shadows``: make shadow maps (a light draws its shadows only
    with them; they cost about ten times the frame on a software renderer)."""

    def __init__(self, model: mujoco.MjModel, max_height: int, max_width: int, shadows: bool = False,
                 max_geom: int = 2000):
        from mujoco import gl_context

        ctx_model = model
        if (max_width > model.vis.global_.offwidth or max_height > model.vis.global_.offheight
                or (shadows and model.vis.quality.shadowsize == 0)):
            ctx_model = _copy_model(model)
            ctx_model.vis.global_.offwidth = max(max_width, model.vis.global_.offwidth)
            ctx_model.vis.global_.offheight = max(max_height, model.vis.global_.offheight)
            if shadows and ctx_model.vis.quality.shadowsize == 0:
                ctx_model.vis.quality.shadowsize = 2048
        self.max_height, self.max_width = max_height, max_width
        self.scene = mujoco.MjvScene(model, maxgeom=max_geom)
        self.option = mujoco.MjvOption()
        self.camera = mujoco.MjvCamera()
        mujoco.mjv_defaultFreeCamera(model, self.camera)
        self._gl = gl_context.GLContext(max_width, max_height) if gl_context.GLContext is not None else None
        if self._gl is not None:
            self._gl.make_current()
        self.context = mujoco.MjrContext(ctx_model, mujoco.mjtFontScale.mjFONTSCALE_150.value)
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN.value, self.context)
        self._geoms = [self.scene.geoms[k] for k in range(max_geom)]  # views into the scene's buffer, made once

    @property
    def geoms(self) -> list:
        """The scene's geoms after the last ``update`` (mjvGeom views: change ``rgba``, ``matid`` before rendering)."""
        return self._geoms[: self.scene.ngeom]

    def update(self, model: mujoco.MjModel, data: mujoco.MjData) -> None:
        mujoco.mjv_updateScene(model, data, self.option, None, self.camera, mujoco.mjtCatBit.mjCAT_ALL.value, self.scene)

    def set_camera(self, position: np.ndarray, rotation: np.ndarray, fovy_deg: float) -> None:
        """Draw from this pose (camera frame columns x, y, z; looking along -z) and vertical field of view."""
        forward, up = -rotation[:, 2], rotation[:, 1]
        for cam in (self.scene.camera[0], self.scene.camera[1]):  # mono rendering averages the two eyes: set both
            cam.pos[:] = position
            cam.forward[:] = forward
            cam.up[:] = up
            top = cam.frustum_near * math.tan(math.radians(fovy_deg) / 2.0)
            cam.frustum_top, cam.frustum_bottom, cam.frustum_center, cam.frustum_width = top, -top, 0.0, 0.0
        for k in range(self.scene.nlight):  # the head light sits on the camera
            light = self.scene.lights[k]
            if light.headlight:
                light.pos[:] = position
                light.dir[:] = forward

    def _draw(self, height: int, width: int) -> mujoco.MjrRect:
        if height > self.max_height or width > self.max_width:
            raise ValueError(f"frame {height}x{width} is larger than this renderer's {self.max_height}x{self.max_width}")
        if self._gl is not None:
            self._gl.make_current()
        rect = mujoco.MjrRect(0, 0, width, height)
        mujoco.mjr_render(rect, self.scene, self.context)
        return rect

    def render_rgb(self, height: int, width: int, out: np.ndarray | None = None) -> np.ndarray:
        """The scene as [height, width, 3] uint8 (into ``out`` when given)."""
        rect = self._draw(height, width)
        buffer = np.empty((height, width, 3), np.uint8)
        mujoco.mjr_readPixels(buffer, None, rect, self.context)
        if out is None:
            return buffer[::-1].copy()
        out[:] = buffer[::-1]
        return out

    def render_geom_ids(self, height: int, width: int) -> np.ndarray:
        """[height, width] int32: the id of the model geom each pixel shows, -1 where no geom (a segmentation pass of
        the current scene)."""
        flags = self.scene.flags
        saved = (flags[mujoco.mjtRndFlag.mjRND_SEGMENT], flags[mujoco.mjtRndFlag.mjRND_IDCOLOR])
        flags[mujoco.mjtRndFlag.mjRND_SEGMENT] = flags[mujoco.mjtRndFlag.mjRND_IDCOLOR] = 1
        try:
            rect = self._draw(height, width)
            buffer = np.empty((height, width, 3), np.uint8)
            mujoco.mjr_readPixels(buffer, None, rect, self.context)
        finally:
            flags[mujoco.mjtRndFlag.mjRND_SEGMENT], flags[mujoco.mjtRndFlag.mjRND_IDCOLOR] = saved
        segid = buffer[::-1].astype(np.int32)
        segid = segid[..., 0] + (segid[..., 1] << 8) + (segid[..., 2] << 16)
        lookup = np.full(self.scene.ngeom + 2, -1, np.int32)
        for g in self.geoms:
            if g.segid >= 0 and g.objtype == mujoco.mjtObj.mjOBJ_GEOM:
                lookup[g.segid + 1] = g.objid
        return lookup[np.minimum(segid, len(lookup) - 1)]

    def render_mask(self, height: int, width: int, geoms: np.ndarray, depth: bool = False):
        """[height, width] bool: the pixels that show one of the model geoms marked True in ``geoms`` (indexed by
        geom id), from a segmentation pass of the current scene; with ``depth`` also [height, width] float32, each
        pixel's distance along the viewing axis (m). A scene of fewer than 255 geoms reads the red channel alone
        (segment ids below 256); larger ones decode all three."""
        flags = self.scene.flags
        saved = (flags[mujoco.mjtRndFlag.mjRND_SEGMENT], flags[mujoco.mjtRndFlag.mjRND_IDCOLOR])
        flags[mujoco.mjtRndFlag.mjRND_SEGMENT] = flags[mujoco.mjtRndFlag.mjRND_IDCOLOR] = 1
        try:
            rect = self._draw(height, width)
            buffer = np.empty((height, width, 3), np.uint8)
            zbuffer = np.empty((height, width), np.float32) if depth else None
            mujoco.mjr_readPixels(buffer, zbuffer, rect, self.context)
        finally:
            flags[mujoco.mjtRndFlag.mjRND_SEGMENT], flags[mujoco.mjtRndFlag.mjRND_IDCOLOR] = saved
        buffer = buffer[::-1]
        if self.scene.ngeom < 255:
            lookup = np.zeros(256, bool)
            for g in self.geoms:
                if g.segid >= 0 and g.objtype == mujoco.mjtObj.mjOBJ_GEOM and geoms[g.objid]:
                    lookup[g.segid + 1] = True
            mask = lookup[buffer[..., 0]]
        else:
            segid = buffer.astype(np.int64)
            segid = segid[..., 0] + (segid[..., 1] << 8) + (segid[..., 2] << 16)
            lookup = np.zeros(self.scene.ngeom + 2, bool)
            for g in self.geoms:
                if g.segid >= 0 and g.objtype == mujoco.mjtObj.mjOBJ_GEOM and geoms[g.objid]:
                    lookup[g.segid + 1] = True
            mask = lookup[np.minimum(segid, len(lookup) - 1)]
        if not depth:
            return mask
        cam = self.scene.camera[0]
        near, far = cam.frustum_near, cam.frustum_far
        z = zbuffer[::-1].astype(np.float64)  # the window depth in [0, 1] -> the distance along the viewing axis
        return mask, (2.0 * near * far / (far + near - (2.0 * z - 1.0) * (far - near))).astype(np.float32)

    def close(self) -> None:
        if self.context is not None:
            if self._gl is not None:
                self._gl.make_current()
            self.context.free()
            self.context = None
        if self._gl is not None:
            self._gl.free()
            self._gl = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the GL library may be gone
            pass


def _copy_model(model: mujoco.MjModel) -> mujoco.MjModel:
    import copy

    return copy.deepcopy(model)
