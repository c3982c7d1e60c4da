"""rlrobot bench (h): the profile's figures are measured against state only in the same run, and the breakdowns add
up to the step they split."""

from types import SimpleNamespace

import pytest

from rlrobot.bench.profile_bench import profile_bench


def test_the_profile_bench_measures_both_modes_and_splits_the_step():
    result = profile_bench(SimpleNamespace(task="so101-reach", profile_num_envs=(2,), seconds=0.3, num_threads=1))
    (row,) = result["rows"]
    assert row["num_envs"] == 2 and len(row["samples"]["state"]) == len(row["samples"]["lerobot"]) == 2
    assert 0 < row["profile_steps_per_s"] < row["state_steps_per_s"]  # rendering two cameras costs something
    assert row["frames_per_s"] == pytest.approx(2 * row["profile_steps_per_s"])
    assert row["frames_per_s_per_core"] == pytest.approx(row["frames_per_s"] / row["threads"])
    split = result["step_split"]
    assert split["render_s"] + split["frames_s"] + split["rest_s"] == pytest.approx(split["step_s"], rel=1e-6)
    assert min(split.values()) > 0 and set(result["frame_ms"]) == {"update", "style", "colour", "segmentation"}
    assert result["frame_ms"]["segmentation"] > 0  # the greenscreen's pass is paid
