"""Setup files: read from JSON (and YAML), refused in one line naming the field, kept whole by a run, written back;
the tasks honour their table placement, spawn regions and cameras."""

import json

import numpy as np
import pytest

import rlrobot
from rlrobot.tasks.cameras import look_at_rotation
from rlrobot.tasks.setup import DEFAULT_SETUP, load_setup, save_setup, setup_text


def default_dict() -> dict:
    return json.loads(DEFAULT_SETUP.read_text())


def write(tmp_path, data, name="station.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_the_default_setup_is_the_shipped_scene():
    setup = load_setup(None)
    assert setup.camera_names == ("front", "wrist") and setup.control_rate_hz == 30 and setup.use_degrees
    front = setup.cameras["front"]
    # the model's front camera: xyaxes 0 1 0 / -0.5 0 0.866
    x, y = np.array([0.0, 1.0, 0.0]), np.array([-0.5, 0.0, 0.866])
    assert front.rotation()[:, 0] == pytest.approx(x, abs=1e-3) and front.rotation()[:, 1] == pytest.approx(y, abs=1e-3)


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["cameras"]["front"].update(fov=50), r"setup.cameras.front: unknown field 'fov' \(allowed: mount, "),
    (lambda d: d["cameras"]["front"].update(fovy_deg=0), r"setup.cameras.front.fovy_deg must be in \[1, 170\], got 0"),
    (lambda d: d["cameras"]["front"].update(mount="ceiling"),
     r"setup.cameras.front.mount='ceiling' is not one of \('world', 'wrist'\)"),
    (lambda d: d["cameras"]["front"].update(quaternion=[1, 0, 0, 0]),
     r"setup.cameras.front: give exactly one of look_at or quaternion"),
    (lambda d: d["randomization"]["lighting"].update(diffuse=[0.9, 0.2]),
     r"setup.randomization.lighting.diffuse=\[0.9, 0.2\] must be \[low, high\]"),
    (lambda d: d["randomization"]["physics"].update(object_mass=[0.0, 1.0]), r"setup.randomization.physics.object_mass must be > 0"),
    (lambda d: d.update(control_rate_hz=500), r"setup.control_rate_hz must be in \[1, 200\], got 500"),
    (lambda d: d["cameras"]["wrist"].update(greenscreen="bg.png"), r"setup.cameras.wrist.greenscreen is for world cameras"),
    (lambda d: d["cameras"]["front"].update(resolution=[480]), r"setup.cameras.front.resolution must be a list of 2 numbers"),
    (lambda d: d["cameras"].update({"top view": d["cameras"]["front"]}), r"setup.cameras.top view: a camera name must be"),
])
def test_a_bad_setup_is_refused_in_one_line_naming_the_field(tmp_path, edit, message):
    data = default_dict()
    edit(data)
    with pytest.raises(ValueError, match=message) as info:
        load_setup(write(tmp_path, data))
    assert "\n" not in str(info.value)


def test_yaml_setups_read_like_json(tmp_path):
    yaml = pytest.importorskip("yaml", reason="PyYAML reads YAML setups")
    path = tmp_path / "station.yaml"
    path.write_text(yaml.safe_dump(default_dict()))
    assert load_setup(path).to_dict() == load_setup(None).to_dict()


def test_a_run_keeps_the_setup_whole_with_its_photo_paths_made_absolute(tmp_path):
    data = default_dict()
    data["cameras"]["front"]["greenscreen"] = "photos/background.png"
    path = write(tmp_path, data)
    kept = setup_text(path)
    assert json.loads(kept)["cameras"]["front"]["greenscreen"] == str(tmp_path / "photos" / "background.png")
    path.unlink()  # the file may go: the inline text rebuilds the same setup
    assert load_setup(kept).to_dict() == json.loads(kept)


def test_save_writes_back_what_load_reads_with_photos_relative_to_the_file(tmp_path):
    data = default_dict()
    data["cameras"]["front"]["greenscreen"] = "bg.png"
    setup = load_setup(write(tmp_path, data))
    setup.cameras["front"].alignment = {"reprojection_error_px": 0.4}
    save_setup(setup, tmp_path / "aligned.json")
    written = json.loads((tmp_path / "aligned.json").read_text())
    assert written["cameras"]["front"]["greenscreen"] == "bg.png" and "source" not in written
    assert load_setup(tmp_path / "aligned.json").cameras["front"].alignment == {"reprojection_error_px": 0.4}


def test_look_at_gives_a_camera_looking_along_minus_z_with_up_up():
    r = look_at_rotation(np.array([1.0, 0.0, 0.5]), np.array([0.0, 0.0, 0.0]), np.array([0.0, 0.0, 1.0]))
    assert r.T @ r == pytest.approx(np.eye(3)) and np.linalg.det(r) == pytest.approx(1.0)
    assert -r[:, 2] == pytest.approx(np.array([-1.0, 0.0, -0.5]) / np.sqrt(1.25))  # looks at the target
    assert r[2, 1] > 0  # its up is up


def test_the_robot_base_placement_moves_the_table_and_not_the_robot(tmp_path):
    data = default_dict()
    data["robot"] = {"base_on_table": [-0.3, 0.1], "base_yaw_deg": 90.0}
    data["table"] = {"size": [1.2, 0.6]}
    env = rlrobot.make("so101-push", 1, setup=str(write(tmp_path, data)))
    table = env.model.geom("table")
    # the robot faces the table's +y: the table's centre, 0.3 m along the table's x and -0.1 along its y from the base,
    # is 0.1 m behind it and 0.3 m to its right (p_robot = R(yaw)^T (p_table - base))
    assert table.pos[:2] == pytest.approx([-0.1, -0.3], abs=1e-9) and table.size[:2] == pytest.approx([0.6, 0.3])
    assert all(m.geom("table").pos[1] == pytest.approx(-0.3) for m in env.models)
    assert env.model.body("base").pos == pytest.approx([0.0, 0.0, 0.0])
    env.close()


def test_the_spawn_regions_place_the_cube_and_the_target(tmp_path):
    data = default_dict()
    data["spawn"] = {"cube": {"center": [0.2, -0.05], "half_size": [0.01, 0.02], "yaw_deg": [10, 20]},
                     "target": {"center": [0.15, 0.05, 0.1], "half_size": [0.0, 0.01, 0.02]}}
    path = str(write(tmp_path, data))
    lift = rlrobot.make("so101-lift", 16, seed=3, setup=path)
    lift.reset(seed=3)
    xy = lift.cube_start[:, :2]
    assert (np.abs(xy - [0.2, -0.05]) <= [0.01 + 1e-9, 0.02 + 1e-9]).all() and np.ptp(xy[:, 1]) > 0.02
    yaw = np.degrees(lift.cube_yaw)
    assert ((yaw >= 10 - 1e-6) & (yaw <= 20 + 1e-6)).all()
    # the cube stands on the table at its own (randomised) size
    halves = np.array([lift.object_half_height(i) for i in range(16)])
    assert lift.cube_start[:, 2] == pytest.approx(halves) and np.ptp(halves) > 0
    lift.close()
    reach = rlrobot.make("so101-reach", 16, seed=3, setup=path)
    reach.reset(seed=3)
    assert (np.abs(reach.target - [0.15, 0.05, 0.1]) <= [1e-9, 0.01 + 1e-9, 0.02 + 1e-9]).all()
    reach.close()


def test_the_setup_is_a_task_option_of_the_so101_tasks_only(tmp_path):
    from rlrobot.tasks.registry import check_task_option

    check_task_option("so101-lift", "setup", str(DEFAULT_SETUP))
    with pytest.raises(ValueError, match=r"setup applies to the tasks .*so101-lift.*; not to task='mujoco-Hopper-v5'"):
        check_task_option("mujoco-Hopper-v5", "setup", str(DEFAULT_SETUP))
    with pytest.raises(FileNotFoundError, match="setup file 'nowhere.json' does not exist"):
        check_task_option("so101-lift", "setup", "nowhere.json")
