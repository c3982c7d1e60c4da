"""``rlrobot deploy`` end to end in a subprocess: twin, local policy or server, recording to a LeRobotDataset."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from rlrobot.data.lerobot_dataset import read_lerobot_dataset

from .conftest import TOKEN


def deploy(*args, check=True):
    env = {**os.environ, "MUJOCO_GL": "egl"}
    p = subprocess.run([sys.executable, "-m", "rlrobot", "deploy", *args], capture_output=True, text=True, env=env,
                       timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(f"deploy failed:\n{p.stdout}\n{p.stderr}")
    return p


def test_deploy_records_a_lerobot_dataset(tmp_path, expert_checkpoint):
    out = tmp_path / "summary.json"
    deploy("--robot", "twin", "--checkpoint", str(expert_checkpoint), "--episodes", "3", "--executor.no-realtime",
           "--record", str(tmp_path / "rec"), "--json-out", str(out))
    summary = json.loads(out.read_text())
    assert summary["episodes"] == 3 and summary["aborted"] == 0 and summary["success_rate"] >= 2 / 3
    ds = read_lerobot_dataset(tmp_path / "rec")
    assert ds["info"]["total_episodes"] == 3 and ds["info"]["total_frames"] == 150 and ds["info"]["fps"] == 25
    f = ds["frames"]
    assert f["observation.state"].shape == (150, 27) and f["action"].shape == (150, 6)
    assert not f["safety.held"].any()
    assert ds["tasks"] == {"move the gripper to the green target": 0} or len(ds["tasks"]) == 1
    # the commanded joint targets move the arm: the next measured joints follow the previous command
    err = np.abs(f["observation.joints"][1:50] - f["action"][:49]).mean()
    assert err < 0.05


@pytest.mark.slow
def test_deploy_through_the_server_and_bad_input(tmp_path, server):
    out = tmp_path / "s.json"
    deploy("--robot", "twin", "--server", server.url, "--token", TOKEN, "--episodes", "2", "--executor.no-realtime",
           "--json-out", str(out))
    summary = json.loads(out.read_text())
    assert summary["round_trip"]["count"] == 100 and summary["round_trip"]["median_ms"] > 0
    p = deploy("--robot", "twin", "--server", server.url, "--token", "wrong", check=False)
    assert p.returncode == 2 and "refused authentication" in p.stdout + p.stderr and "Traceback" not in p.stderr
    p = deploy("--robot", "twin", check=False)
    assert p.returncode != 0 and "exactly one of --checkpoint" in p.stdout + p.stderr
    p = deploy("--robot", "ur5", "--checkpoint", "x", check=False)
    assert p.returncode != 0 and "robot='ur5' is not one of" in p.stdout + p.stderr
