"""MuJoCo Warp backend (``--backend mjwarp``): the native MJCF tasks with all envs stepped as one batched
``mujoco_warp`` simulation (one world per env) on an NVIDIA GPU, or on Warp's CPU device for tests.

Only the physics changes. The task classes in ``so101.py`` keep every line of task code (control-mode mapping and IK,
observations, rewards, success, resets, scripted experts): they read the same gather buffers (qpos, qvel, site and
body poses, contact flags, TCP Jacobian), which this backend fills from the Warp arrays with one device-to-host copy
per control step. Resets are written by the task into host ``MjData`` objects, exactly as on the native backend,
then uploaded into the reset worlds, so initial-state distributions are identical across backends and a native
``get_state()`` loads here (and back). The physics-randomisation bank becomes per-world model fields (friction, mass,
inertia). On CUDA the ``frame_skip`` physics steps of a control step run as one captured CUDA graph.

Differences from the native backend, by design of MuJoCo Warp: float32 physics (trajectories agree with native
MuJoCo to about a millimetre over a few dozen contact-free steps; ``tests/tasks/test_mjwarp_backend.py`` measures
it), fixed per-world contact / constraint capacity (``nconmax`` / ``njmax``; an overflow raises instead of dropping
contacts), and camera images rendered by the host renderer after a state download (slow: use state observations).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import mujoco
import numpy as np
import torch

from .mujoco_vec_env import MujocoVecEnv

INSTALL_HINT = "pip install 'rlrobot[warp]' (mujoco-warp and warp-lang)"
# what the backend uploads on a reset and downloads for get_state / rendering: MuJoCo's integration state
STATE_FIELDS = ("qpos", "qvel", "act", "ctrl", "mocap_pos", "mocap_quat", "qacc_warmstart")
RANDOMIZED_MODEL_FIELDS = ("geom_friction", "body_mass", "body_inertia")


def require_mujoco_warp():
    """Import warp and mujoco_warp, or fail with the install line."""
    try:
        import mujoco_warp
        import warp
    except ImportError as e:
        raise ImportError(f"the mjwarp backend needs MuJoCo Warp, which is not installed: {INSTALL_HINT}") from e
    warp.config.quiet = True
    return warp, mujoco_warp


class MjWarpPhysics:
    """Mixin that replaces ``MujocoVecEnv``'s per-env ``MjData`` stepping with one batched MuJoCo Warp simulation.

    Put it first in the bases of a native task class (``mjwarp_task_class`` does): every task hook stays the task's.
    """

    backend = "mjwarp"

    def __init__(self, num_envs: int, *, nconmax: int | None = None, njmax: int | None = None, **kw: Any):
        wp, mjw = require_mujoco_warp()
        self._wp, self._mjw = wp, mjw
        # the host MjData objects only receive resets and serve rendering: no stepping threads needed
        kw["num_threads"] = 1
        super().__init__(num_envs, **kw)
        if self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"device={self.device}: the mjwarp backend runs on 'cpu' (Warp's CPU device) or 'cuda'")
        self.warp_device = wp.get_device("cpu" if self.device.type == "cpu" else f"cuda:{self.device.index or 0}")
        with wp.ScopedDevice(self.warp_device):
            batched = {f: num_envs for f in RANDOMIZED_MODEL_FIELDS} if len(self.models) > 1 else None
            self.wmodel = mjw.put_model(self.model, batch_sizes=batched)
            self.wdata = mjw.make_data(self.model, nworld=num_envs, nconmax=nconmax, njmax=njmax)
            self._jacp_w = wp.zeros((num_envs, 3, self.model.nv), dtype=float)
            self._jacr_w = wp.zeros((num_envs, 3, self.model.nv), dtype=float)
            self._jac_point_w = wp.zeros(num_envs, dtype=wp.vec3)
            body = self.model.site_bodyid[self._jac_site_id] if self._jac_site_id >= 0 else 0
            self._jac_body_w = wp.array(np.full(num_envs, body, dtype=np.int32), dtype=int)
        # zero-copy torch views of the Warp arrays (same device): indexed writes for resets, one packed read per step
        d = self.wdata
        self._w = {name: wp.to_torch(getattr(d, name)) for name in (*STATE_FIELDS, "time", "site_xpos", "site_xmat",
                                                                     "xpos", "xquat", "sensordata", "overflow")}
        self._w["jacp"], self._w["jacr"] = wp.to_torch(self._jacp_w), wp.to_torch(self._jacr_w)
        self._model_views = {f: wp.to_torch(getattr(self.wmodel, f)) for f in RANDOMIZED_MODEL_FIELDS} if batched else {}
        self._bank = {f: torch.as_tensor(np.stack([getattr(m, f) for m in self.models]), dtype=torch.float32,
                                         device=self.device) for f in self._model_views}
        self._site_ids_t = torch.as_tensor(self._site_ids, device=self.device)
        self._body_ids_t = torch.as_tensor(self._body_ids, device=self.device)
        self._contact_adr_t = torch.as_tensor(self._contact_adr, device=self.device)
        self._graph = None
        # compile (or load from Warp's kernel cache) every kernel now, before any CUDA graph capture
        self._launch_physics_steps()
        self._refresh_kinematics()
        with wp.ScopedDevice(self.warp_device):  # mujoco_warp launches on Warp's current device, not the arrays'
            mjw.forward(self.wmodel, self.wdata)
            mjw.reset_data(self.wmodel, self.wdata)
        self._handoff_to_torch()

    # ---------------------------------------------------------------- physics
    def _launch_physics_steps(self) -> None:
        wp, mjw = self._wp, self._mjw
        if self._graph is not None:
            wp.capture_launch(self._graph)
            return
        with wp.ScopedDevice(self.warp_device):
            for _ in range(self.frame_skip):
                mjw.step(self.wmodel, self.wdata)

    def _capture_graph(self) -> None:
        """On CUDA, replay the frame_skip steps as one graph: a control step becomes one launch instead of hundreds."""
        wp = self._wp
        if self.warp_device.is_cuda and self._graph is None:
            with wp.ScopedCapture(device=self.warp_device) as capture:
                for _ in range(self.frame_skip):
                    self._mjw.step(self.wmodel, self.wdata)
            self._graph = capture.graph

    def _refresh_kinematics(self) -> None:
        """After ``step`` the frames describe the state before the last integration (as in C MuJoCo): recompute them
        and the TCP Jacobian for the new state, like the native backend's ``_kinematics``."""
        mjw = self._mjw
        with self._wp.ScopedDevice(self.warp_device):
            mjw.kinematics(self.wmodel, self.wdata)
            mjw.com_pos(self.wmodel, self.wdata)
            if self._jac_site_id >= 0:
                self._wp.launch(_site_point_kernel(), dim=self.num_envs,
                                inputs=[self.wdata.site_xpos, self._jac_site_id], outputs=[self._jac_point_w])
                mjw.jac(self.wmodel, self.wdata, self._jacp_w, self._jacr_w, self._jac_point_w, self._jac_body_w)

    def _handoff_to_warp(self) -> None:
        """Warp runs on its own CUDA stream: let torch's writes land before Warp reads them (no-op on the CPU)."""
        if self.warp_device.is_cuda:
            torch.cuda.current_stream(self.device).synchronize()

    def _handoff_to_torch(self) -> None:
        if self.warp_device.is_cuda:
            self._wp.synchronize_stream(self._wp.get_stream(self.warp_device))

    def _physics_step(self) -> None:
        self._w["ctrl"].copy_(torch.from_numpy(self.ctrl))
        self._handoff_to_warp()
        self._capture_graph()
        self._launch_physics_steps()
        self._refresh_kinematics()
        self._handoff_to_torch()

    def raw_step(self) -> None:
        self._launch_physics_steps()
        self._wp.synchronize_device(self.warp_device)

    def _gather_all(self) -> None:
        """One packed device-to-host copy of everything the task code reads, split into the gather buffers."""
        w, n = self._w, self.num_envs
        parts = {"qpos": w["qpos"], "qvel": w["qvel"], "site_pos": w["site_xpos"][:, self._site_ids_t],
                 "site_mat": w["site_xmat"][:, self._site_ids_t], "body_pos": w["xpos"][:, self._body_ids_t],
                 "body_quat": w["xquat"][:, self._body_ids_t], "contacts": w["sensordata"][:, self._contact_adr_t],
                 "jacp": w["jacp"], "jacr": w["jacr"], "overflow": w["overflow"]}
        flat = [p.reshape(n, -1).to(torch.float32) for p in parts.values()]
        packed = torch.cat(flat, 1).cpu().numpy().astype(np.float64)
        blocks = np.split(packed, np.cumsum([f.shape[1] for f in flat])[:-1], axis=1)
        for (name, _), block in zip(parts.items(), blocks, strict=True):
            if name == "contacts":
                self.contacts[:] = block > 0
            elif name == "overflow":
                self._check_overflow(block[:, 0].astype(np.int64))
            else:
                buf = getattr(self, name)
                buf[:] = block.reshape(buf.shape)

    def _check_overflow(self, overflow: np.ndarray) -> None:
        from mujoco_warp import OverflowType

        lost = OverflowType.NEFC | OverflowType.BROADPHASE | OverflowType.NARROWPHASE
        if (overflow & int(lost)).any():
            per_world = self.wdata.naconmax // self.num_envs
            raise RuntimeError(
                f"mjwarp: contacts or constraints overflowed the per-world capacity (nconmax={per_world}, "
                f"njmax={self.wdata.njmax}); pass larger nconmax= / njmax= task options")

    def _check_divergence(self) -> None:
        """C MuJoCo resets a diverged MjData (mjWARN_BADQACC); Warp does not, so do the same here: mark the episode
        unstable (it ends this step) and put the world back to the model's defaults so no NaN reaches an observation."""
        bad = ~(np.isfinite(self.qpos).all(1) & np.isfinite(self.qvel).all(1)) | (np.abs(self.qvel) > 1e4).any(1)
        if not bad.any():
            return
        self.unstable |= bad
        ids = bad.nonzero()[0]
        for i in ids:
            mujoco.mj_resetData(self.model, self.datas[i])
        self._upload(ids)
        self._forward_after_upload()
        self._gather_all()

    # ---------------------------------------------------------------- host <-> device
    def _upload(self, ids: np.ndarray) -> None:
        """Write the host MjData state of envs ``ids`` (and their model-bank row) into their Warp worlds."""
        mask = np.zeros(self.num_envs, dtype=bool)
        mask[ids] = True
        with self._wp.ScopedDevice(self.warp_device):
            self._mjw.reset_data(self.wmodel, self.wdata, self._wp.array(mask, dtype=bool))
        self._handoff_to_torch()
        idx = torch.as_tensor(ids, device=self.device)
        for name in STATE_FIELDS:
            rows = np.stack([getattr(self.datas[i], name).reshape(-1) for i in ids])
            view = self._w[name]
            view[idx] = torch.as_tensor(rows, dtype=view.dtype, device=self.device).reshape(len(ids), *view.shape[1:])
        self._w["time"][idx] = torch.as_tensor([self.datas[i].time for i in ids], dtype=self._w["time"].dtype,
                                               device=self.device)
        bank_rows = torch.as_tensor(self.model_index[ids], device=self.device)
        for field, view in self._model_views.items():
            view[idx] = self._bank[field][bank_rows]
        self._handoff_to_warp()

    def _forward_after_upload(self) -> None:
        with self._wp.ScopedDevice(self.warp_device):
            self._mjw.forward(self.wmodel, self.wdata)
        self._refresh_kinematics()
        self._handoff_to_torch()

    def _download(self, ids: np.ndarray | None = None) -> None:
        """Copy the Warp state of envs ``ids`` (default all) into their host MjData (for get_state and rendering)."""
        ids = np.arange(self.num_envs) if ids is None else ids
        host = {name: self._w[name].cpu().numpy() for name in (*STATE_FIELDS, "time")}
        for i in ids:
            d = self.datas[i]
            for name in STATE_FIELDS:
                getattr(d, name)[:] = host[name][i].reshape(getattr(d, name).shape)
            d.time = float(host["time"][i])

    def _after_host_reset(self, ids: np.ndarray) -> None:
        self._upload(ids)
        self._forward_after_upload()

    # ---------------------------------------------------------------- state, rendering
    def get_state(self) -> dict[str, Any]:
        self._download()
        return super().get_state()

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)  # validates and loads the host MjData and the task's own arrays
        self._upload(np.arange(self.num_envs))
        self._forward_after_upload()
        self._gather_all()

    def _sync_host_for_render(self, ids) -> None:
        self._download(np.asarray(ids))
        for i in ids:
            mujoco.mj_kinematics(self.models[self.model_index[i]], self.datas[i])

    def _render_all(self) -> np.ndarray:
        self._sync_host_for_render(range(self.num_envs))
        return super()._render_all()

    def render(self, env_index: int = 0, camera: str = "front") -> np.ndarray:
        self._sync_host_for_render([env_index])
        return super().render(env_index, camera)

    def load_measurement(self, *args, **kwargs) -> None:
        raise NotImplementedError("the robot bridge runs the task code on the native backend (backend='mujoco'); "
                                  "mjwarp is for batched training")


@cache
def _site_point_kernel():
    """Warp kernel: each world's position of one site, the point whose Jacobian ``mjw.jac`` computes."""
    wp, _ = require_mujoco_warp()

    @wp.kernel
    def site_point(site_xpos: wp.array2d(dtype=wp.vec3), site: int, point: wp.array(dtype=wp.vec3)):
        world = wp.tid()
        point[world] = site_xpos[world, site]

    return site_point


@cache
def mjwarp_task_class(task_cls: type[MujocoVecEnv]) -> type[MujocoVecEnv]:
    """The native task class with its physics on MuJoCo Warp (same task code, batched worlds)."""
    return type(f"{task_cls.__name__}MjWarp", (MjWarpPhysics, task_cls), {"__doc__": task_cls.__doc__})
