"""``rlrobot bench`` (h): the cost of the LeRobot profile's observations, measured against state only in the same run.

The profile env (``--obs-mode lerobot``: two cameras of the shipped setup at 64x64, every randomisation on, a
greenscreen photo behind the front camera so that its segmentation pass is paid) and the same task with the same
setup in ``--obs-mode state`` (same physics, latency and 30 Hz, no rendering) step with random joint targets,
alternately (state, profile, state, profile) so that machine load hits both. Reported per env count: env steps/s of
each, their ratio, camera frames/s and frames/s per core. Where the time goes: the profile step split into the
rendering phase (worker threads), the frame phase (``prepare_frames`` and the frame-level randomisation, main thread)
and the rest (physics, task code, observation bookkeeping); and one frame on one thread split into its scene update,
its per-env styling (lights, colours), the colour pass and the greenscreen's segmentation pass.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table

from rlrobot.bench.common import console, vecenv_rate


def _profile_setup(directory: Path) -> str:
    """The shipped default setup with a greenscreen photo behind its front camera (inline JSON)."""
    import imageio.v3 as iio

    from rlrobot.tasks.setup import load_setup

    rng = np.random.default_rng(0)
    photo = (rng.random((480, 640, 3)) * 255).astype(np.uint8)
    iio.imwrite(directory / "background.png", photo)
    setup = load_setup(None).to_dict()
    setup["cameras"]["front"]["greenscreen"] = str(directory / "background.png")
    return json.dumps(setup)


def _split_step(env, seconds: float) -> dict[str, float]:
    """Seconds per env step in the rendering phase, the frame phase and the rest, over ``seconds`` of random steps."""
    import torch

    spent = {"render": 0.0, "frames": 0.0}
    pipeline = env.camera_pipeline
    render, finish = env.render_setup_cameras, pipeline.finish

    def timed_finish(*a, **k):
        start = time.perf_counter()
        try:
            return finish(*a, **k)
        finally:
            spent["frames"] += time.perf_counter() - start

    def timed_render(*a, **k):
        start = time.perf_counter()
        try:
            return render(*a, **k)
        finally:
            spent["render"] += time.perf_counter() - start

    pipeline.finish, env.render_setup_cameras = timed_finish, timed_render
    gen = torch.Generator().manual_seed(1)
    steps, start = 0, time.perf_counter()
    try:
        while time.perf_counter() - start < seconds:
            env.step(torch.rand(env.num_envs, env.action_dim, generator=gen) * 2 - 1)
            steps += 1
    finally:
        pipeline.finish, env.render_setup_cameras = finish, render
    total = time.perf_counter() - start
    render_only = spent["render"] - spent["frames"]  # finish runs inside render_setup_cameras
    return {"step_s": total / steps, "render_s": render_only / steps, "frames_s": spent["frames"] / steps,
            "rest_s": (total - spent["render"]) / steps}


def _one_frame(env, reps: int = 200) -> dict[str, float]:
    """Milliseconds of one front-camera frame on one thread, by part."""
    pipe = env.camera_pipeline
    renderer = pipe.make_renderer(env.model)
    model, data = env.models[env.model_index[0]], env.datas[0]
    h, w = pipe.render_shapes[0]
    out = np.empty((h, w, 3), np.uint8)
    parts = {"update": 0.0, "style": 0.0, "colour": 0.0, "segmentation": 0.0}
    try:
        for _ in range(reps):
            t0 = time.perf_counter()
            renderer.update(model, data)
            t1 = time.perf_counter()
            pipe._style_scene(renderer, 0)
            renderer.set_camera(*pipe.camera_pose(0, 0, data))
            t2 = time.perf_counter()
            renderer.render_rgb(h, w, out=out)
            t3 = time.perf_counter()
            renderer.render_geom_ids(h, w)
            t4 = time.perf_counter()
            for key, dt in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                parts[key] += dt
    finally:
        renderer.close()
    return {key: value / reps * 1e3 for key, value in parts.items()}


def profile_bench(args: Any) -> dict[str, Any]:
    """Rows per env count of ``args.profile_num_envs`` plus the step and frame breakdowns (at the largest count)."""
    import rlrobot

    task = args.task if args.task.startswith("so101-") else "so101-lift"
    rows = []
    with tempfile.TemporaryDirectory(prefix="rlrobot-bench-profile-") as directory:
        setup = _profile_setup(Path(directory))
        split: dict[str, float] = {}
        frame: dict[str, float] = {}
        for n in args.profile_num_envs:
            rates: dict[str, list[float]] = {"state": [], "lerobot": []}
            for mode in ("state", "lerobot") * 2:
                env = rlrobot.make(task, n, seed=0, obs_mode=mode, control_mode="joint_pos", setup=setup,
                                   num_threads=args.num_threads or None)
                env.reset(seed=0)
                rates[mode].append(vecenv_rate(env, n, args.seconds))
                if mode == "lerobot" and n == max(args.profile_num_envs) and not split:
                    split, frame = _split_step(env, args.seconds), _one_frame(env)
                cameras, threads = (len(env.profile_cameras), env.num_threads) if mode == "lerobot" else (0, env.num_threads)
                env.close()
            state, profile = (float(np.mean(rates[m])) for m in ("state", "lerobot"))
            cameras = 2
            rows.append({"num_envs": n, "threads": threads, "cameras": cameras, "state_steps_per_s": state,
                         "profile_steps_per_s": profile, "profile_over_state": profile / state,
                         "frames_per_s": profile * cameras, "frames_per_s_per_core": profile * cameras / threads,
                         "samples": rates})
    table = Table(title=f"(h) the LeRobot profile: {task}, 2 cameras 64x64 from 480x640 frames, every randomisation "
                        f"and a greenscreen on, against state only (same setup, 30 Hz)")
    for col in ("num_envs", "state env steps/s", "profile env steps/s", "profile/state", "frames/s", "frames/s per core"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(str(r["num_envs"]), f"{r['state_steps_per_s']:,.0f}", f"{r['profile_steps_per_s']:,.0f}",
                      f"{r['profile_over_state']:.3f}", f"{r['frames_per_s']:,.0f}", f"{r['frames_per_s_per_core']:,.0f}")
    console.print(table)
    step = split["step_s"]
    console.print(f"where a profile step's time goes ({max(args.profile_num_envs)} envs): rendering "
                  f"{split['render_s'] / step:.0%}, frames (crop, resize, noise, colour) {split['frames_s'] / step:.0%}, "
                  f"the rest (physics, task, bookkeeping) {split['rest_s'] / step:.0%}; one front frame on one thread: "
                  + ", ".join(f"{k} {v:.2f} ms" for k, v in frame.items()), soft_wrap=True)
    return {"task": task, "rows": rows, "step_split": split, "frame_ms": frame}
