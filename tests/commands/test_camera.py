"""rlrobot camera: capture moves only the allowed joints, through the supervisor; align recovers a perturbed camera
from synthetic photos within 1 cm and 1 degree in under a minute; overlay draws the arm over the photos."""

import json
import time

import imageio.v3 as iio
import numpy as np
import pytest

from rlrobot.commands.camera import main
from rlrobot.real_robot.safety import STS3215_MAX_VELOCITY
from rlrobot.tasks.camera_alignment import CameraPose, load_photos
from rlrobot.tasks.cameras import mat_to_quat
from rlrobot.tasks.setup import load_setup


def station(tmp_path, seed: int) -> tuple:
    """A nominal setup (what the user measured) and the true one (where the camera really is: up to 5 cm, 5 degrees and
    5 degrees of field of view away), whose twin takes the photos against a cluttered background photo."""
    nominal = load_setup(None).to_dict()
    nominal["cameras"] = {"front": nominal["cameras"]["front"]}
    (tmp_path / "nominal.json").write_text(json.dumps(nominal))
    rng = np.random.default_rng(seed)
    cam = load_setup(tmp_path / "nominal.json").cameras["front"]
    start = CameraPose(np.array(cam.position), cam.rotation(), cam.fovy_deg)
    true = start.moved(np.r_[rng.uniform(-5, 5, 3), rng.uniform(-5, 5, 3), rng.uniform(-5, 5)])
    truth = json.loads(json.dumps(nominal))
    front = truth["cameras"]["front"]
    front.pop("look_at")
    front.update(position=true.position.tolist(), quaternion=mat_to_quat(true.rotation).tolist(), fovy_deg=true.fovy_deg,
                 greenscreen="background.png")
    truth["randomization"]["camera"] = {"position_m": 0.0, "rotation_deg": 0.0, "fovy_deg": 0.0}  # one true camera
    yy, xx = np.mgrid[0:480, 0:640]
    background = np.stack([110 + 40 * np.sin(xx / 150.0 + c) * np.cos(yy / 200.0) for c in range(3)], -1).astype(np.uint8)
    for _ in range(12):  # objects on the table and behind it
        y, x = rng.integers(0, 440), rng.integers(0, 600)
        h, w = rng.integers(10, 120, 2)
        background[y:y + h, x:x + w] = rng.integers(0, 255, 3)
    iio.imwrite(tmp_path / "background.png", background)
    (tmp_path / "true.json").write_text(json.dumps(truth))
    return start, true


def capture_twin(tmp_path, poses: int = 8, allow=("all",), seed: int = 0) -> dict:
    return main(["capture", "--setup", str(tmp_path / "nominal.json"), "--out", str(tmp_path / "photos"), "--robot", "twin",
                 "--twin-setup", str(tmp_path / "true.json"), "--allow-joints", *allow, "--poses", str(poses),
                 "--seed", str(seed)])


def test_capture_moves_only_the_allowed_joints_slowly_through_the_supervisor(tmp_path):
    station(tmp_path, 0)
    result = capture_twin(tmp_path, poses=3, allow=("shoulder_lift", "elbow_flex"))
    commands = [targets for _, kind, targets in result["commands"] if kind == "act"]
    assert len(commands) > 100
    first = commands[0]
    held = [0, 3, 4, 5]  # shoulder_pan, wrist_flex, wrist_roll, gripper: never asked to move
    assert all(np.array_equal(c[held], first[held]) for c in commands)
    steps = np.abs(np.diff(np.array(commands), axis=0)).max(1)
    # --speed 0.4 rad/s at 30 Hz within each move; each of the 4 moves (3 poses and back) starts from the measured
    # position, which lags the previous move's last command a little (within the servo's speed)
    assert (steps > 0.4 / 30 + 1e-9).sum() <= 4 and steps.max() <= STS3215_MAX_VELOCITY / 30
    moved = np.ptp(np.array(commands), axis=0)
    assert moved[1] > 0.5 and moved[2] > 0.5  # the allowed joints did move (to the poses and back)
    camera, photos = load_photos(tmp_path / "photos")
    assert camera == "front" and len(photos) == 3 and photos[0].image.shape == (480, 640, 3)
    poses_json = json.loads((tmp_path / "photos" / "poses.json").read_text())
    assert len(poses_json["photos"][0]["state"]) == 6 and poses_json["use_degrees"] is True


def test_capture_refuses_without_the_joints_it_may_move(tmp_path):
    station(tmp_path, 0)
    with pytest.raises(ValueError, match=r"allow_joints: name the joints the arm may move"):
        capture_twin(tmp_path, allow=())
    with pytest.raises(ValueError, match=r"allow_joints: 'elbow' is not one of"):
        capture_twin(tmp_path, allow=("elbow",))


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_align_recovers_a_camera_5_cm_5_degrees_away_within_1_cm_and_1_degree_in_a_minute(tmp_path, seed):
    start, true = station(tmp_path, seed)
    assert start.error_to(true)[0] > 0.04 and start.error_to(true)[1] > 4.0
    capture_twin(tmp_path, seed=seed)
    began = time.perf_counter()
    result = main(["align", "--setup", str(tmp_path / "nominal.json"), "--photos", str(tmp_path / "photos"), "--out",
                   str(tmp_path / "aligned.json")])
    seconds = time.perf_counter() - began
    cam = load_setup(tmp_path / "aligned.json").cameras["front"]
    found = CameraPose(np.array(cam.position), cam.rotation(), cam.fovy_deg)
    position_m, rotation_deg, fovy_deg = found.error_to(true)
    print(f"seed {seed}: {position_m * 100:.2f} cm, {rotation_deg:.3f} deg, fov {fovy_deg:.3f} deg in {seconds:.1f} s, "
          f"reprojection {result['reprojection_error_px']:.2f} px (was {result['initial_error_px']:.2f})")
    assert position_m < 0.01 and rotation_deg < 1.0 and fovy_deg < 1.0 and seconds < 60
    assert cam.look_at is None and cam.alignment["photos"] == 8 and cam.alignment["reprojection_error_px"] < 2.0
    out = main(["overlay", "--setup", str(tmp_path / "aligned.json"), "--photos", str(tmp_path / "photos"), "--out",
                str(tmp_path / "overlay.png")])
    assert iio.imread(out).shape == (960, 2560, 3)  # 8 photos, 4 to a row


def test_align_refuses_photos_it_cannot_use_in_one_line(tmp_path):
    station(tmp_path, 0)
    with pytest.raises(FileNotFoundError, match=r"no poses.json \(rlrobot camera capture writes one\)"):
        main(["align", "--setup", str(tmp_path / "nominal.json"), "--photos", str(tmp_path)])
    capture_twin(tmp_path, poses=3, allow=("shoulder_pan",))
    with pytest.raises(ValueError, match=r"camera='wrist' is not in the setup \(front\)"):
        main(["align", "--setup", str(tmp_path / "nominal.json"), "--photos", str(tmp_path / "photos"), "--camera", "wrist"])
    with pytest.raises(ValueError, match=r"camera: 'calibrate' is not one of \('capture', 'align', 'overlay'\)"):
        main(["calibrate"])
