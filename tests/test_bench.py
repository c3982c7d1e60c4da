import json

from rlrobot.bench.mujoco_bench import BenchArgs, run_bench


def test_bench_reports_all_columns(tmp_path):
    result = run_bench(BenchArgs(num_envs=(8,), seconds=0.2, ppo_iterations=1, sac_seconds=0.5,
                                 json_out=str(tmp_path / "b.json")))
    (row,) = result["ppo"]
    for key in ("raw_steps_per_s", "rollout_steps_per_s", "vecenv_steps_per_s", "ppo_steps_per_s"):
        assert row[key] > 0
    assert abs(row["b_over_a"] - row["vecenv_steps_per_s"] / row["raw_steps_per_s"]) < 1e-9
    sac = result["sac"]
    assert sac["sac_updates_per_s"] > 0 and sac["sac_env_steps_per_s"] > 0 and sac["collect_steps_per_s"] > 0
    # at UTD u, updates per env step over the timed window is u (fractions carry over between iterations)
    assert abs(sac["sac_updates_per_s"] / sac["sac_env_steps_per_s"] - sac["utd"]) < 0.05 * sac["utd"] + 1e-9
    assert json.loads((tmp_path / "b.json").read_text())["sac"]["num_envs"] == sac["num_envs"]


def test_maniskill_bench(tmp_path):
    import pytest

    pytest.importorskip("mani_skill", reason="ManiSkill3 is not installed (pip install 'rlrobot[maniskill]')")
    import glob

    if not glob.glob("/usr/share/vulkan/icd.d/*.json") + glob.glob("/etc/vulkan/icd.d/*.json"):
        pytest.skip("no Vulkan driver (ManiSkill/SAPIEN needs one; Debian: mesa-vulkan-drivers >= 24.3)")
    result = run_bench(BenchArgs(backend="maniskill", num_envs=(2,), seconds=0.3, ppo_iterations=1,
                                 json_out=str(tmp_path / "m.json")))
    (row,) = result["rows"]
    assert row["sim_steps_per_s"] > 0 and row["vecenv_steps_per_s"] > 0 and row["ppo_steps_per_s"] > 0
    assert abs(row["b_over_a"] - row["vecenv_steps_per_s"] / row["sim_steps_per_s"]) < 1e-9
    assert json.loads((tmp_path / "m.json").read_text())["task"] == "maniskill:PushCube-v1"


def test_mjwarp_bench(tmp_path):
    import pytest

    pytest.importorskip("mujoco_warp", reason="mujoco-warp is not installed (pip install 'rlrobot[warp]')")
    result = run_bench(BenchArgs(backend="mjwarp", device="cpu", num_envs=(4,), seconds=0.3, ppo_iterations=1,
                                 ppo_steps=2, json_out=str(tmp_path / "w.json")))
    (row,) = result["rows"]
    for key in ("native_raw_steps_per_s", "warp_raw_steps_per_s", "warp_vecenv_steps_per_s", "warp_ppo_steps_per_s"):
        assert row[key] > 0
    assert abs(row["b_over_a"] - row["warp_raw_steps_per_s"] / row["native_raw_steps_per_s"]) < 1e-9
    assert json.loads((tmp_path / "w.json").read_text())["device"] == "cpu"


def test_bench_rejects_unknown_backend():
    import pytest

    with pytest.raises(ValueError, match="backend='physx' is not one of"):
        BenchArgs(backend="physx")
