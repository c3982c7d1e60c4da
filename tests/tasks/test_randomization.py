"""Domain randomisation of the profile's scene: each randomisation changes what it claims and nothing else, the
greenscreen shows the photo wherever neither robot nor object is, and a seed reproduces an episode's frames."""

import json

import imageio.v3 as iio
import numpy as np
import pytest
import torch

import rlrobot
from rlrobot.tasks.cameras import FrameRenderer
from rlrobot.tasks.profile import crop_box
from rlrobot.tasks.randomization import load_photo
from rlrobot.tasks.setup import load_setup

STILL = {"friction": [1, 1], "object_mass": [1, 1]}


def setup_with(**randomization) -> str:
    """The default setup with only the given randomisation (inline JSON)."""
    data = load_setup(None).to_dict()
    data["randomization"] = {"physics": STILL, "greenscreen": False, **randomization}
    return json.dumps(data)


def make(setup: str, num_envs: int = 1, task: str = "so101-lift", seed: int = 0):
    env = rlrobot.make(task, num_envs, seed=seed, obs_mode="lerobot", control_mode="joint_pos", setup=setup,
                       num_threads=1)
    env.reset(seed=seed)
    return env


def redraw(env, seed: int) -> np.ndarray:
    """Env 0's frames [cameras, S, S, 3] after a new visual draw, the physical scene unchanged."""
    env.camera_pipeline.draw(np.array([0]), np.random.default_rng(seed))
    return env.render_setup_cameras(np.array([0]))[0]


def geom_ids(env, camera: int = 0) -> np.ndarray:
    """Which geom each pixel of env 0's camera shows (the camera's current pose, no jitter drawn)."""
    pipe = env.camera_pipeline
    h, w = pipe.render_shapes[camera]
    renderer = FrameRenderer(env.model, h, w)
    renderer.update(env.model, env.datas[0])
    renderer.set_camera(*pipe.camera_pose(0, camera, env.datas[0]))
    ids = renderer.render_geom_ids(h, w)
    renderer.close()
    top, left, _, _ = crop_box(h, w, pipe.crops[camera])
    return ids[top:top + 64, left:left + 64]


def robot_mask(env) -> np.ndarray:
    return np.isin(geom_ids(env), env.camera_pipeline.parts.robot)


def test_without_randomisation_every_draw_gives_the_same_frames():
    env = make(setup_with())
    assert np.array_equal(redraw(env, 1), redraw(env, 2))
    env.close()


def test_lighting_changes_the_brightness_of_the_scene():
    env = make(setup_with(lighting={"direction_deg": 40, "diffuse": [0.1, 1.0], "ambient": [0.05, 0.6],
                                    "headlight": [0.1, 0.8]}))
    means = [redraw(env, s).astype(float).mean() for s in range(6)]
    assert np.ptp(means) > 20  # 0..255 units
    env.close()


def test_robot_colours_change_the_robot_and_nothing_else():
    env = make(setup_with(colors={"robot": 0.3}))
    a, b = redraw(env, 1)[0], redraw(env, 2)[0]
    changed = (a != b).any(-1)
    robot = robot_mask(env)
    assert changed[robot].mean() > 0.8 and not changed[~robot].any()
    env.close()


def test_table_colours_and_textures_change_the_table_only():
    env = make(setup_with(colors={"table": 0.3, "table_textures": True}))
    table = geom_ids(env) == env.model.geom("table").id
    frames = [redraw(env, s)[0] for s in range(6)]
    changed = np.any([(f != frames[0]).any(-1) for f in frames[1:]], axis=0)
    assert changed[table].mean() > 0.8 and not changed[~table].any()
    assert len({int(m) for m in env.camera_pipeline.draws["table_material"]}) == 1  # one env: drawn anew each time
    draws = [env.camera_pipeline.draw(np.array([0]), np.random.default_rng(s)) or int(env.camera_pipeline.draws["table_material"][0])
             for s in range(12)]
    assert len(set(draws)) >= 3  # several of the table's textures
    env.close()


def test_object_colours_change_the_cube():
    env = make(setup_with(colors={"objects": 0.3}))
    cube = geom_ids(env) == env.model.geom("cube").id
    assert env.camera_pipeline.parts.objects == (env.model.geom("cube").id,)
    if not cube.any():  # the cube may be out of the front camera's crop: the wrist camera sees it
        pytest.skip("the cube is not in the front frame of this seed")
    a, b = redraw(env, 1)[0], redraw(env, 2)[0]
    changed = (a != b).any(-1)
    assert changed[cube].mean() > 0.8 and not changed[~cube].any()
    env.close()


def test_camera_jitter_moves_and_zooms_the_picture():
    moved = make(setup_with(camera={"position_m": 0.03, "rotation_deg": 3.0}))
    centroids = []
    for s in range(5):
        moved.camera_pipeline.draw(np.array([0]), np.random.default_rng(s))
        rows, cols = np.nonzero(robot_mask(moved))
        centroids.append((rows.mean(), cols.mean()))
    assert np.ptp(np.array(centroids), axis=0).max() > 2.0  # pixels
    moved.close()
    zoomed = make(setup_with(camera={"fovy_deg": 8.0}))
    areas = []
    for s in range(5):
        zoomed.camera_pipeline.draw(np.array([0]), np.random.default_rng(s))
        fovy = zoomed.camera_pipeline.fovy[0] + zoomed.camera_pipeline.draws["cam_dfovy"][0, 0]
        areas.append((fovy, robot_mask(zoomed).sum()))
    areas.sort()
    assert areas[0][1] > areas[-1][1] * 1.1  # a narrower field of view shows the arm larger
    zoomed.close()


def test_pixel_noise_changes_every_frame_with_its_std():
    env = make(setup_with(image={"noise_std": 4.0}))
    a = env.render_setup_cameras(np.array([0]))[0].astype(float)
    b = env.render_setup_cameras(np.array([0]))[0].astype(float)  # the same scene, a new frame
    assert np.std(a - b) == pytest.approx(4.0 * np.sqrt(2), rel=0.1)
    env.close()


def test_blur_softens_the_frame_and_the_colour_effects_do_what_they_say():
    plain = make(setup_with())
    base = redraw(plain, 0).astype(float)
    plain.close()
    blurred = make(setup_with(image={"blur_probability": 1.0}))
    soft = redraw(blurred, 0).astype(float)
    blurred.close()

    from rlrobot.tasks.randomization import box_blur

    assert np.abs(soft - np.clip(np.rint(box_blur(base)), 0, 255)).max() <= 1.0  # each frame, 3x3 box
    assert np.abs(np.diff(soft, axis=2)).mean() < 0.9 * np.abs(np.diff(base, axis=2)).mean()
    env = make(setup_with(image={"brightness": 0.5, "contrast": 0.5, "saturation": 1.0}))
    pipe = env.camera_pipeline
    for s in range(4):
        frames = redraw(env, s).astype(float)
        b, c, sat = (pipe.draws[k][0, 0] for k in ("brightness", "contrast", "saturation"))
        expected = base[0].mean(-1, keepdims=True) + sat * (base[0] - base[0].mean(-1, keepdims=True))
        expected = (expected.mean() + c * (expected - expected.mean())) * b
        assert np.abs(frames[0] - np.clip(expected, 0, 255)).mean() < 1.0
    env.close()


def test_the_greenscreen_shows_the_photo_wherever_neither_robot_nor_object_is(tmp_path):
    rng = np.random.default_rng(0)
    photo = rng.integers(0, 255, (480, 640, 3), dtype=np.uint8)
    iio.imwrite(tmp_path / "background.png", photo)
    data = json.loads(setup_with())
    data["randomization"]["greenscreen"] = True
    data["cameras"]["front"]["greenscreen"] = str(tmp_path / "background.png")
    env = make(json.dumps(data), task="so101-push")
    frame = env.render_setup_cameras(np.array([0]))[0, 0]
    pipe = env.camera_pipeline
    h, w = pipe.render_shapes[0]
    small = load_photo(str(tmp_path / "background.png"), (h, w))
    top, left, _, _ = crop_box(h, w, pipe.crops[0])
    expected_background = small[top:top + 64, left:left + 64]
    ids = geom_ids(env)
    background = (ids < 0) | (ids == env.model.geom("table").id)
    assert background.mean() > 0.5
    assert np.array_equal(frame[background], expected_background[background])
    foreground = np.isin(ids, pipe.parts.robot + (env.model.geom("cube").id, env.model.geom("target").id))
    assert foreground.any() and (frame[foreground] != expected_background[foreground]).any(-1).mean() > 0.9
    assert "wrist" not in [n for n, p in zip(pipe.names, pipe.greenscreen, strict=True) if p]
    env.close()


def test_shadows_darken_what_the_arm_hides_from_the_light():
    lit = make(setup_with(lighting={"shadow_probability": 0.0}))
    shaded = make(setup_with(lighting={"shadow_probability": 1.0}))
    a, b = redraw(lit, 0).astype(float), redraw(shaded, 0).astype(float)
    table = geom_ids(shaded) == shaded.model.geom("table").id
    assert bool(shaded.camera_pipeline.draws["shadows"][0]) and not bool(lit.camera_pipeline.draws["shadows"][0])
    assert (a[0] - b[0])[table].max() > 30  # the arm's shadow on the table
    lit.close()
    shaded.close()


def test_the_physics_bank_draws_each_parameter_within_its_range():
    data = json.loads(setup_with(physics={"friction": [0.5, 1.5], "object_mass": [0.5, 2.0], "object_size": [0.8, 1.2],
                                          "joint_damping": [0.5, 2.0], "joint_armature": [0.5, 2.0], "bank_size": 8}))
    env = rlrobot.make("so101-lift", 1, setup=json.dumps(data))
    base = env.models[0]
    cube, body = base.geom("cube").id, base.body("cube").id
    dof = base.joint("elbow_flex").dofadr[0]
    ratios = np.array([[m.geom_friction[cube, 0] / base.geom_friction[cube, 0], m.body_mass[body] / base.body_mass[body],
                        m.geom_size[cube, 0] / base.geom_size[cube, 0], m.dof_damping[dof] / base.dof_damping[dof],
                        m.dof_armature[dof] / base.dof_armature[dof]] for m in env.models[1:]])
    low, high = np.array([0.5, 0.5, 0.8, 0.5, 0.5]), np.array([1.5, 2.0, 1.2, 2.0, 2.0])
    assert ((ratios >= low - 1e-9) & (ratios <= high + 1e-9)).all() and (np.ptp(ratios, axis=0) > 0.1).all()
    env.close()


def test_a_seed_reproduces_an_episodes_frames_and_another_seed_does_not():
    setup = json.dumps(load_setup(None).to_dict())  # the default: every randomisation on

    def episode(seed):
        env = rlrobot.make("so101-lift", 2, seed=seed, obs_mode="lerobot", control_mode="joint_pos", setup=setup,
                           max_episode_steps=6)
        obs, _ = env.reset(seed=seed)
        frames = [obs["image_front"].clone(), obs["image_wrist"].clone()]
        gen = torch.Generator().manual_seed(0)
        for _ in range(8):  # through an autoreset
            obs, *_ = env.step(torch.rand(2, 6, generator=gen) * 2 - 1)
            frames += [obs["image_front"].clone(), obs["image_wrist"].clone(), obs["state"].clone()]
        env.close()
        return frames

    a, b, c = episode(5), episode(5), episode(6)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[0], c[0])
