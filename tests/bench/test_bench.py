import json

import pytest

from rlrobot.commands.bench import BenchArgs, run_bench


@pytest.mark.slow
def test_bench_reports_all_columns(tmp_path):
    result = run_bench(BenchArgs(num_envs=(8,), seconds=0.2, ppo_iterations=1, sac_seconds=0.5, images_num_envs=2,
                                 json_out=str(tmp_path / "b.json")))
    images = result["images"]
    assert images["state_steps_per_s"] > 0 and images["cameras"] == 2
    assert abs(images["frames_per_s"] - 2 * images["rgb_steps_per_s"]) < 1e-6
    (row,) = result["ppo"]
    for key in ("raw_steps_per_s", "rollout_steps_per_s", "vecenv_steps_per_s", "ppo_steps_per_s"):
        assert row[key] > 0
    assert abs(row["b_over_a"] - row["vecenv_steps_per_s"] / row["raw_steps_per_s"]) < 1e-9
    sac = result["sac"]
    assert sac["sac_updates_per_s"] > 0 and sac["sac_env_steps_per_s"] > 0 and sac["collect_steps_per_s"] > 0
    # at UTD u, updates per env step over the timed window is u (fractions carry over between iterations)
    assert abs(sac["sac_updates_per_s"] / sac["sac_env_steps_per_s"] - sac["utd"]) < 0.05 * sac["utd"] + 1e-9
    assert json.loads((tmp_path / "b.json").read_text())["sac"]["num_envs"] == sac["num_envs"]


def test_bench_trains_the_tasks_ppo_preset():
    """(c) times what ``rlrobot train --algo ppo --task T`` trains: the preset's network, epochs and optimizer."""
    from rlrobot.bench.common import ppo_bench_config
    from rlrobot.configs import preset

    cfg = ppo_bench_config("so101-reach", 32, control_mode="joint_pos")
    want = preset("so101-reach", "ppo")
    assert cfg.policy == want.policy and cfg.ppo == want.ppo and cfg.policy.actor_hidden == (64, 64)
    assert (cfg.num_envs, cfg.control_mode, cfg.logger) == (32, "joint_pos", "none")
    wide = ppo_bench_config("so101-reach", 32, (256, 128, 64))
    assert wide.policy.actor_hidden == wide.policy.critic_hidden == (256, 128, 64)


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


@pytest.mark.slow
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


def test_peers_bench_interleaves_and_reports_ratios(tmp_path):
    """rlrobot and the peers on the same task in one run; ratios are the medians' quotients. Needs the bench extra."""
    import pytest

    from rlrobot.bench.peers_bench import PeerSettings, missing_peers, run_peers_bench

    if missing_peers():
        pytest.skip(f"{', '.join(missing_peers())} not installed: pip install 'rlrobot[bench]'")
    s = PeerSettings(num_envs=2, rollout_steps=8, num_epochs=1, minibatch_size=8, hidden=(16,), iterations=1,
                     raw_num_envs=(2,), raw_seconds=0.1, rounds=2, compile_row=False)
    result = run_peers_bench(s, only=("ppo_rlrobot_native", "ppo_sb3", "raw_rlrobot_physics", "raw_envpool"),
                             progress_json=str(tmp_path / "p.json"))
    med = result["median"]
    assert set(med) == {"ppo_rlrobot_native", "ppo_rlrobot_native_fast", "ppo_sb3", "raw_rlrobot_physics_2", "raw_envpool_2"}
    assert all(len(v) == 2 and min(v) > 0 for v in result["samples"].values())
    ratio = result["ratios"]["PPO train: rlrobot native / SB3"]
    assert abs(ratio - med["ppo_rlrobot_native"] / med["ppo_sb3"]) < 1e-12
    fast = result["ratios"]["PPO train: rlrobot native fast (tanh-fast, fused Adam) / SB3"]  # the opt-ins, beside
    assert abs(fast - med["ppo_rlrobot_native_fast"] / med["ppo_sb3"]) < 1e-12
    assert json.loads((tmp_path / "p.json").read_text())["samples"]["ppo_sb3"] == result["samples"]["ppo_sb3"]


def test_peers_bench_compiled_row_needs_two_iterations():
    import pytest

    from rlrobot.bench.peers_bench import PeerSettings

    with pytest.raises(ValueError, match="peer.iterations=1"):
        PeerSettings(iterations=1)
    assert PeerSettings(iterations=1, compile_row=False).iterations == 1


def test_peers_bench_names_the_extra_when_a_peer_is_missing(monkeypatch):
    import importlib.util

    import pytest

    from rlrobot.bench import peers_bench

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "envpool" else real(name, *a))
    with pytest.raises(ImportError, match=r"envpool.*rlrobot\[bench\]"):
        peers_bench.run_peers_bench(peers_bench.PeerSettings())
