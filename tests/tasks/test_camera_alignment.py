"""The pieces of camera alignment: safe calibration poses, exact edge distances, camera geometry that inverts, and
the search space."""

import mujoco
import numpy as np
import pytest

from rlrobot.tasks.camera_alignment import (
    CALIBRATION_POSES,
    CameraPose,
    OrbitParameters,
    back_project,
    nearest_edges,
    project,
)
from rlrobot.tasks.cameras import FrameRenderer, look_at_rotation
from rlrobot.tasks.so101 import HOME_QPOS, JOINT_HIGH, JOINT_LOW, SO101Env


def lowest_point(model, data, geoms) -> float:
    low = np.inf
    corners = np.array([[sx, sy, sz] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)])
    for g in geoms:
        box = corners * model.geom_aabb[g, 3:] + model.geom_aabb[g, :3]
        low = min(low, float((data.geom_xpos[g] + box @ data.geom_xmat[g].reshape(3, 3).T)[:, 2].min()))
    return low


def test_every_calibration_pose_and_the_way_to_it_from_home_keep_the_arm_3_cm_above_the_table():
    model = mujoco.MjModel.from_xml_path(SO101Env.xml_path)
    data = mujoco.MjData(model)
    upper = model.body("upper_arm").id

    def moves(g):
        b = int(model.geom_bodyid[g])
        while b not in (0, upper):
            b = int(model.body_parentid[b])
        return b == upper

    moving = [g for g in range(model.ngeom) if moves(g)]
    assert len(CALIBRATION_POSES) == 14
    for pose in CALIBRATION_POSES:
        assert ((pose >= JOINT_LOW) & (pose <= JOINT_HIGH)).all()
        for t in np.linspace(0.0, 1.0, 41):
            data.qpos[:6] = (1 - t) * HOME_QPOS + t * pose
            mujoco.mj_kinematics(model, data)
            assert lowest_point(model, data, moving) > 0.03, pose


def test_nearest_edges_gives_the_exact_distance_and_the_pixel():
    rng = np.random.default_rng(0)
    edges = rng.random((90, 120)) < 0.002
    dist, rows, cols = nearest_edges(edges, 32)
    er, ec = np.nonzero(edges)
    for r, c in rng.integers(0, (90, 120), (200, 2)):
        exact = np.sqrt((er - r) ** 2 + (ec - c) ** 2).min()
        if exact <= 32:
            assert dist[r, c] == pytest.approx(exact) and edges[rows[r, c], cols[r, c]]
        else:
            assert np.isinf(dist[r, c])


def test_pixels_project_back_onto_the_points_the_renderer_drew():
    model = mujoco.MjModel.from_xml_path(SO101Env.xml_path)
    data = mujoco.MjData(model)
    data.qpos[:6] = HOME_QPOS
    mujoco.mj_forward(model, data)
    position = np.array([0.55, 0.1, 0.35])
    pose = CameraPose(position, look_at_rotation(position, np.array([0.15, 0.0, 0.08]), np.array([0, 0, 1.0])), 50.0)
    robot = np.zeros(model.ngeom, bool)
    robot[model.geom("fixed_jaw").id] = True
    renderer = FrameRenderer(model, 240, 320)
    renderer.update(model, data)
    renderer.set_camera(pose.position, pose.rotation, pose.fovy_deg)
    mask, depth = renderer.render_mask(240, 320, robot, depth=True)
    renderer.close()
    rows, cols = np.nonzero(mask)
    points = back_project(rows, cols, depth[rows, cols].astype(np.float64), pose, 240, 320)
    assert project(points, pose, 240, 320) == pytest.approx(np.stack([cols, rows], 1), abs=1e-6)
    # the points lie on the fixed jaw's box (half sizes 0.032 x 0.003 x 0.011 m)
    jaw = model.geom("fixed_jaw").id
    local = (points - data.geom_xpos[jaw]) @ data.geom_xmat[jaw].reshape(3, 3)
    assert (np.abs(local) <= np.array([0.032, 0.003, 0.011]) + 2e-3).all()


def test_the_search_space_starts_at_the_start_and_zoom_keeps_the_point_looked_at():
    position = np.array([0.62, 0.0, 0.36])
    start = CameraPose(position, look_at_rotation(position, np.array([0.19, 0.0, 0.11]), np.array([0, 0, 1.0])), 55.0)
    space = OrbitParameters(start, depth=0.5)
    at_zero = space.pose(np.zeros(7))
    assert at_zero.error_to(start) == pytest.approx((0.0, 0.0, 0.0), abs=1e-6)
    zoomed = space.pose(np.array([0, 0, 0, 0, 0, 0, 10.0]))  # 10 % larger picture: a narrower field of view
    assert zoomed.position == pytest.approx(start.position) and zoomed.fovy_deg < start.fovy_deg
    further = space.pose(np.array([0, 0, 0, 0, 0, 5.0, 0]))  # 5 cm back, same picture scale: a wider field of view
    assert np.linalg.norm(further.position - start.position) == pytest.approx(0.05) and further.fovy_deg > 55.0
    target = space.target
    orbited = space.pose(np.array([0, 0, 4.0, 0, 0, 0, 0]))  # orbiting keeps the target in the middle of the picture
    assert project(target[None], orbited, 480, 640)[0] == pytest.approx([319.5, 239.5], abs=1e-6)
