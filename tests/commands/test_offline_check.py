"""The offline-RL workflow (Kumar et al. 2021): the diagnostics the critic-based offline algorithms log (workflow_metrics,
by hand for IQL and Cal-QL), that logging them changes no training result, the held-out split, the rules of ``rlrobot
offline-check`` on hand-made series, its errors, and the check on real runs made to overfit (six episodes, half held
out, 256x256 networks) and to underfit (every episode, a critic of 2 hidden units)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from rlrobot.algorithms.cal_ql import CalQL, CalQLConfig
from rlrobot.algorithms.iql import IQL, IQLConfig
from rlrobot.algorithms.offline import PROBE_SIZE, split_episodes
from rlrobot.commands.offline_check import GAP, UNDERFIT, OfflineCheckArgs, diagnose, run_offline_check
from rlrobot.config import train_config
from rlrobot.data.transitions import synthetic_transitions


# ---------------------------------------------------------------------- the metrics
def test_split_episodes_holds_out_the_last_episodes_whole():
    data = synthetic_transitions((10, 12, 8, 9, 11))
    train, held = split_episodes(data, 0.4)
    assert len(train) == 30 and len(held) == 20
    assert train.episode_index.unique().tolist() == [0, 1, 2] and held.episode_index.unique().tolist() == [3, 4]
    assert int(held.episode_end[0]) == 8 and int(train.episode_end[-1]) == 29  # ends recomputed inside each part
    assert len(split_episodes(data, 0.01)[1]) == 11  # at least one episode
    assert split_episodes(data, 0.99)[0].num_episodes == 1  # never all


def test_iqls_diagnostics_are_the_probes_q_and_relative_td_error():
    data = synthetic_transitions((20,) * 10, obs_dim=3, action_dim=2)
    algo = IQL(IQLConfig(hidden=(16,), holdout_fraction=0.2), 3, 2, data, "cpu", torch.Generator().manual_seed(0))
    assert len(algo.data) == 160 and len(algo.holdout) == 40  # training never sees the held-out episodes
    state = algo.generator.get_state()
    out = algo.workflow_metrics()
    assert torch.equal(algo.generator.get_state(), state)  # the probes do not draw from the training stream
    probe = algo._probes["train"]
    assert len(probe) == PROBE_SIZE
    with torch.no_grad():
        s, s_next = algo.normalize(probe.obs), algo.normalize(probe.next_obs)
        q = algo.networks["critic"](s, probe.actions).mean(0)
        y = probe.rewards + 0.99 * (~probe.terminals).float() * algo.networks["value"](s_next).squeeze(-1)
    assert out["q_data"] == pytest.approx(float(q.mean()), rel=1e-5)
    assert out["td_train"] == pytest.approx(float((q - y).square().mean() / y.var()), rel=1e-5)
    assert set(out) == {"q_data", "td_train", "td_holdout"}
    assert algo.workflow_metrics() == out  # the same probes every time


def test_cal_ql_diagnostics_use_the_actors_mean_next_action_and_the_target_critics():
    data = synthetic_transitions((20,) * 4, obs_dim=3, action_dim=2)
    algo = CalQL(CalQLConfig(hidden=(16,)), 3, 2, data, "cpu", torch.Generator().manual_seed(0))
    out = algo.workflow_metrics()
    probe = algo._probes["train"]
    with torch.no_grad():
        s, s_next = algo.normalize(probe.obs), algo.normalize(probe.next_obs)
        a_next = torch.tanh(algo.networks["actor"](s_next)[0])
        y = probe.rewards + 0.99 * (~probe.terminals).float() * algo.networks["critic_target"](s_next, a_next).min(0).values
        q = algo.networks["critic"](s, probe.actions).mean(0)
    assert out["td_train"] == pytest.approx(float((q - y).square().mean() / y.var()), rel=1e-5)
    assert "td_holdout" not in out


def test_algorithms_without_a_dataset_q_log_no_diagnostics():
    from rlrobot.algorithms.bc import BC, BCConfig

    assert BC(BCConfig(hidden=(8,)), 4, 2, synthetic_transitions(), "cpu").workflow_metrics() == {}


def _learner(name: str, data, seed: int = 0, **section):
    from rlrobot.algorithms.registry import algorithm_spec

    spec = algorithm_spec(name)
    torch.manual_seed(seed)  # the networks' initialisation
    return spec.learner(spec.config(hidden=(16, 16), **section), 3, 2, data, "cpu", torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", ["iql", "cal-ql"])
def test_logging_the_diagnostics_leaves_training_bit_identical(name):
    """The probes are drawn from a generator of their own and the critics run without gradients in eval mode: a run
    that logs the diagnostics after every update has the same losses and weights, bit for bit, as one that does not."""
    data = synthetic_transitions((20,) * 6, obs_dim=3, action_dim=2)

    def train(log: bool) -> tuple[list[dict[str, float]], dict[str, torch.Tensor]]:
        learner = _learner(name, data)
        torch.manual_seed(1)  # Cal-QL's actor samples from the global stream
        losses = []
        for _ in range(12):
            losses.append(learner.update())
            if log:
                learner.workflow_metrics()
        return losses, learner.networks.state_dict()

    (quiet, quiet_weights), (logged, logged_weights) = train(log=False), train(log=True)
    assert quiet == logged
    assert all(torch.equal(value, logged_weights[key]) for key, value in quiet_weights.items())


@pytest.mark.parametrize("name,section", [("iql", {}), ("cal-ql", {}), ("awac", {}), ("fql", {}), ("f-dvl", {}),
                                          ("edp", {"objective": "iql"}), ("edp", {"objective": "td3", "sampler_steps": 3})])
def test_every_critic_on_dataset_actions_logs_the_diagnostics(name, section):
    data = synthetic_transitions((20,) * 8, obs_dim=3, action_dim=2)
    learner = _learner(name, data, holdout_fraction=0.25, batch_size=32, **section)
    state = learner.generator.get_state()
    out = learner.workflow_metrics()
    assert set(out) == {"q_data", "td_train", "td_holdout"} and all(torch.isfinite(torch.tensor(v)) for v in out.values())
    assert torch.equal(learner.generator.get_state(), state)
    assert learner.workflow_metrics() == out  # deterministic: the same probes, the same next actions
    learner.update()
    assert learner.workflow_metrics() != out


def test_the_list_of_algorithms_with_diagnostics_comes_from_their_learners():
    from rlrobot.algorithms.offline import workflow_algorithm_names

    assert set(workflow_algorithm_names()) == {"iql", "cal-ql", "awac", "fql", "f-dvl", "edp"}


@pytest.mark.parametrize("name", ["bc", "rql", "recoil", "bc-union"])
def test_a_holdout_is_refused_for_an_algorithm_without_diagnostics(name):
    run = train_config(name, task="so101-push", dataset="somewhere")
    run.algorithm.holdout_fraction = 0.1
    with pytest.raises(ValueError, match=rf"{name.replace('-', '_')}.holdout_fraction must be 0 for algo='{name}' .*: awac, cal-ql"):
        run.validate()


def test_a_bad_holdout_fraction_is_refused_naming_the_field():
    run = train_config("iql", task="so101-push", dataset="somewhere")
    run.iql.holdout_fraction = 1.0
    with pytest.raises(ValueError, match=r"iql.holdout_fraction must be in \[0, 1\)"):
        run.validate()


# ---------------------------------------------------------------------- the rules
def series(**columns):
    return {k: list(enumerate(v)) for k, v in columns.items()}


def test_the_rules_on_hand_made_series():
    flat = [1.0, 2.0, 3.0, 3.5, 3.8, 4.0, 4.1, 4.2]
    low = [0.2, 0.05, 0.02, 0.01, 0.01, 0.008, 0.007, 0.007]
    gap = diagnose(series(q_data=flat, td_train=[t / 10 for t in low], td_holdout=[0.3, 0.1, 0.06, 0.05, 0.06, 0.08, 0.09, 0.1]))
    assert gap["regime"] == "overfitting" and gap["evidence"]["td_holdout_min_step"] == 3
    assert "step 3" in gap["advice"][0]  # the held-out minimum, before the end: early stopping
    peaked = diagnose(series(q_data=[1.0, 3.0, 5.0, 4.0, 3.5, 3.0, 2.8, 2.6], td_train=low))
    assert peaked["regime"] == "overfitting" and peaked["evidence"]["q_peak_step"] == 2
    high = diagnose(series(q_data=flat, td_train=[1.0, 0.6, 0.4, 0.3, 0.3, 0.3, 0.28, 0.27], td_holdout=[1.0, 0.7, 0.5] + [0.45] * 5))
    assert high["regime"] == "underfitting" and "hidden" in high["advice"][0]
    fine = diagnose(series(q_data=flat, td_train=low, td_holdout=[3 * t for t in low]))
    assert fine["regime"] == "neither"
    assert GAP > 3 and UNDERFIT > 0.007
    with pytest.raises(ValueError, match="logs no workflow metrics"):
        diagnose(series(q_data=flat))


# ---------------------------------------------------------------------- runs made to over- and underfit
@pytest.fixture(scope="module")
def reach_noisy(tmp_path_factory):
    from rlrobot.commands.collect import CollectArgs, collect_demonstrations

    out = tmp_path_factory.mktemp("workflow") / "reach_noisy"
    collect_demonstrations(CollectArgs(task="so101-reach", episodes=40, out=str(out), num_envs=8, noise=0.3))
    return out


def _run(tmp_path, dataset, algo: str, **section) -> str:
    from rlrobot.runners.base import make_runner

    cfg = train_config(algo, task="so101-reach", dataset=str(dataset), out=str(tmp_path / algo), logger="none", video=False,
                       eval_episodes=2, eval_envs=2, num_threads=1, update_threads=1, num_envs=1, seed=0)
    steps = section.pop("gradient_steps")
    setattr(cfg, cfg.spec.config_field, dataclasses.replace(cfg.algorithm, gradient_steps=steps,
                                                            updates_per_iteration=steps // 8, **section))
    cfg.eval_every = 8  # one evaluation, at the end: the check reads training metrics only
    make_runner(cfg).learn()
    return cfg.out


@pytest.mark.parametrize("algo", ["iql", pytest.param("cal-ql", marks=pytest.mark.slow)])  # Cal-QL: ~6 min on a busy CPU
def test_offline_check_tells_an_overfitting_run_from_an_underfitting_one(algo, reach_noisy, tmp_path):
    """Overfitting: 6 of the 40 episodes, 3 of them held out, 256x256 networks, 1,600 steps (small data, large net).
    Underfitting: all 40 episodes (4 held out), 2 hidden units (large data, small net). Measured (IQL, seed 0): overfit
    held-out TD error 1.01 of the targets' variance, 147x the training one (0.0069), lowest at step 800; underfit
    training TD error 3.14. Cal-QL (seed 0): overfit 0.69, 10x the training one (0.07); underfit 0.40."""
    over = _run(tmp_path / "over", reach_noisy, algo, gradient_steps=1600, max_episodes=6, holdout_fraction=0.5,
                hidden=(256, 256), batch_size=64)
    under = _run(tmp_path / "under", reach_noisy, algo, gradient_steps=1600, holdout_fraction=0.1, hidden=(2,), batch_size=64)
    verdict_over = run_offline_check(OfflineCheckArgs(run=over, json_out=str(tmp_path / "over.json")))
    verdict_under = run_offline_check(OfflineCheckArgs(run=under))
    assert verdict_over["regime"] == "overfitting", verdict_over
    assert verdict_under["regime"] == "underfitting", verdict_under
    assert json.loads((tmp_path / "over.json").read_text())["regime"] == "overfitting"
    assert any(f"--{algo}.hidden smaller" in line for line in verdict_over["advice"])
    assert f"--{algo}.hidden 256 256" in verdict_under["advice"][0]
    assert f"LayerNorm in the critics (--{algo}.critic-layer-norm)" in verdict_under["advice"]


def test_offline_check_refuses_a_directory_without_metrics(tmp_path):
    with pytest.raises(FileNotFoundError, match="has no metrics.jsonl"):
        run_offline_check(OfflineCheckArgs(run=str(tmp_path)))


def test_offline_check_of_a_run_without_the_diagnostics_says_which_algorithms_log_them(tmp_path, capsys):
    from rlrobot.cli import main

    rows = [{"env_steps": 100 * i, "loss/actor": 1.0 / i} for i in range(1, 6)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "config.json").write_text(json.dumps({"train": {"algo": "bc"}}))
    with pytest.raises(SystemExit) as exit_:
        main(["offline-check", str(tmp_path)])
    assert exit_.value.code == 2
    line = capsys.readouterr().out.strip()
    assert "algo='bc'" in line and "logs no workflow metrics" in line and "iql" in line and len(line.splitlines()) == 1
