from rlrobot.bench.mujoco_bench import BenchArgs, run_bench


def test_bench_reports_all_columns(tmp_path):
    rows = run_bench(BenchArgs(num_envs=(8,), seconds=0.2, ppo_iterations=1, json_out=str(tmp_path / "b.json")))
    (row,) = rows
    for key in ("raw_steps_per_s", "rollout_steps_per_s", "vecenv_steps_per_s", "ppo_steps_per_s"):
        assert row[key] > 0
    assert abs(row["b_over_a"] - row["vecenv_steps_per_s"] / row["raw_steps_per_s"]) < 1e-9
    assert (tmp_path / "b.json").is_file()
