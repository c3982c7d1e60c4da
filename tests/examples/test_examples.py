"""Every script in examples/ runs: with --smoke (seconds) in the fast tier, as written (minutes) in the slow tier."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SCRIPTS = sorted(p.name for p in EXAMPLES.glob("*.py"))


def run(script: str, tmp_path: Path, *args: str, timeout: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "MUJOCO_GL": "egl", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, str(EXAMPLES / script), *args], cwd=tmp_path, capture_output=True, text=True,
                          env=env, timeout=timeout)


def test_there_are_examples_and_each_is_listed():
    assert 4 <= len(SCRIPTS) <= 6
    listing = (EXAMPLES / "README.md").read_text()
    for script in SCRIPTS:
        assert f"`{script}`" in listing, f"examples/README.md does not list {script}"


@pytest.mark.parametrize("script", SCRIPTS)
def test_example_runs_in_smoke_mode(script, tmp_path):
    p = run(script, tmp_path, "--smoke", timeout=600)
    assert p.returncode == 0, f"{script} --smoke failed:\n--- stdout\n{p.stdout[-4000:]}\n--- stderr\n{p.stderr[-4000:]}"
    assert "run dir" in p.stdout


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS)
def test_example_runs_as_written(script, tmp_path):
    p = run(script, tmp_path, timeout=3600)
    assert p.returncode == 0, f"{script} failed:\n--- stdout\n{p.stdout[-4000:]}\n--- stderr\n{p.stderr[-4000:]}"
