"""The flow-RL update benchmark runs all three algorithms on the same rollout and reports a time for each."""

from rlrobot.bench.flow_rl_bench import run


def test_flow_rl_update_bench_times_every_algorithm():
    result = run(num_envs=4, rollout_chunks=2, repeats=1)
    assert set(result) == {"flow-noise", "flow-sde", "flow-nft"}
    assert all(seconds > 0 for seconds in result.values())
