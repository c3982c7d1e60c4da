"""What the offline algorithms share (rlrobot.algorithms.offline): the expectile loss, the registry look-up, the
'offline' policy kind that rebuilds a checkpoint's policy, and the refusals of bad input before any compute."""

import pytest
import torch

from rlrobot.algorithms.offline import OFFLINE_POLICY_KIND, expectile_loss, offline_algorithm_names
from rlrobot.algorithms.registry import algorithm_spec
from rlrobot.config import train_config
from rlrobot.data.transitions import synthetic_transitions


def test_expectile_loss_is_asymmetric_with_the_right_sign():
    # u = target - prediction; tau = 0.9 weighs under-estimates (u > 0) by 0.9 and over-estimates by 0.1
    under, over = torch.tensor([1.0]), torch.tensor([-1.0])
    assert expectile_loss(under, 0.9).item() == pytest.approx(0.9)
    assert expectile_loss(over, 0.9).item() == pytest.approx(0.1)
    assert expectile_loss(under, 0.5).item() == expectile_loss(over, 0.5).item() == pytest.approx(0.5)
    # minimised over a constant v it gives an upper expectile of the targets: above their mean for tau > 0.5
    targets = torch.tensor([0.0, 0.0, 0.0, 1.0])
    grid = torch.linspace(0, 1, 101)
    best = grid[torch.stack([expectile_loss(targets - v, 0.9) for v in grid]).argmin()]
    assert best.item() == pytest.approx(0.75)  # 0.9 * 1 * (1 - v) = 0.1 * 3 * v  ->  v = 0.75 > mean 0.25


def test_the_registry_lists_the_offline_algorithms_with_their_learners_and_capabilities():
    assert {"bc", "iql", "cal-ql", "fql", "rql", "awac"} <= set(offline_algorithm_names())
    assert all(algorithm_spec(name).learner is not None for name in offline_algorithm_names())
    reward_free = {name for name in offline_algorithm_names() if not algorithm_spec(name).needs_rewards}
    assert {"bc", "recoil", "bc-union"} <= reward_free and not {"iql", "cal-ql", "fql", "rql", "awac"} & reward_free
    assert algorithm_spec("sac").learner is None and "sac" not in offline_algorithm_names()


@pytest.mark.parametrize("algo", ["bc", "iql", "cal-ql"])
def test_a_checkpoint_rebuilds_the_same_policy_through_the_policy_registry(algo):
    from rlrobot.policies.registry import build_policy

    cfg = train_config(algo, task="so101-push", dataset="x")
    section = cfg.algorithm
    section.hidden = (16,)
    data = synthetic_transitions((10, 10), obs_dim=4, action_dim=2)
    learner = algorithm_spec(algo).learner(section, 4, 2, data, "cpu", torch.Generator().manual_seed(0))
    for _ in range(3):
        learner.update()
    assert learner.updates == 3
    meta = {"train": cfg.to_dict(), "policy_kind": OFFLINE_POLICY_KIND, "obs_dim": 4, "action_dim": 2}
    rebuilt = build_policy(meta, cfg)
    rebuilt.load_state_dict(learner.policy.state_dict())
    obs = {"state": torch.randn(5, 4)}
    assert torch.equal(rebuilt.act(obs), learner.policy.act(obs))
    assert rebuilt.act(obs).abs().max() <= 1.0
    state = learner.state_dict()
    other = algorithm_spec(algo).learner(section, 4, 2, data, "cpu", torch.Generator().manual_seed(1))
    other.load_state_dict(state)
    assert other.updates == 3


@pytest.mark.parametrize("fraction", [0.0, -0.1, 1.5])
def test_a_labelled_fraction_outside_0_1_is_refused(fraction):
    cfg = train_config("iql", task="so101-push", dataset="data", labelled_fraction=fraction)
    with pytest.raises(ValueError, match=r"labelled_fraction must be in \(0, 1\]"):
        cfg.validate()


def test_bad_offline_config_and_missing_dataset_are_refused():
    cfg = train_config("iql", task="so101-push")
    with pytest.raises(ValueError, match="algo='iql' needs --dataset DIR"):
        cfg.validate()
    cfg.dataset = "data"
    cfg.iql.expectile = 1.0
    with pytest.raises(ValueError, match=r"iql.expectile must be in \(0, 1\), got 1.0"):
        cfg.validate()
    cfg = train_config("cal-ql", task="so101-push", dataset="data", obs_mode="rgb")
    with pytest.raises(ValueError, match="algo='cal-ql' trains on state observations; obs_mode='rgb'"):
        cfg.validate()
    cfg = train_config("bc", task="so101-push", dataset="/nonexistent/ds")
    with pytest.raises(FileNotFoundError, match="is not a LeRobotDataset"):
        cfg.prepare()


def test_offline_bench_refuses_bad_names_before_any_compute(tmp_path):
    from rlrobot.commands.offline_bench import OfflineBenchArgs, run_offline_bench

    out = str(tmp_path / "bench")
    with pytest.raises(ValueError, match="recipe='medium' is not a dataset recipe"):
        run_offline_bench(OfflineBenchArgs(recipes=("medium",), out=out))
    with pytest.raises(ValueError, match="algos: 'ppo' is not an offline algorithm"):
        run_offline_bench(OfflineBenchArgs(algos=("ppo",), out=out))
    with pytest.raises(ValueError, match=r"seeds_for: 'iql' is not ALGO:SEED"):
        run_offline_bench(OfflineBenchArgs(seeds_for=("iql",), out=out))
    with pytest.raises(ValueError, match=r"labelled_fraction must be in \(0, 1\]"):
        run_offline_bench(OfflineBenchArgs(labelled_fraction=2.0, out=out))
    assert not (tmp_path / "bench").exists()


def test_bench_times_gradient_steps_at_the_preset():
    from rlrobot.bench.offline_bench import gradient_steps_per_s

    row = gradient_steps_per_s("bc", "so101-push", obs_dim=37, action_dim=5, seconds=0.05)
    assert row["hidden"] == [64, 64] and row["batch_size"] == 256  # configs/bc_so101_push.py
    assert row["steps"] >= 3 and row["gradient_steps_per_s"] > 0
