"""ReCOIL and BC on the union (rlrobot/algorithms/recoil.py): the union of two datasets, the critics' LS-IQ targets by
hand, a seeded imitation run on a 1-D reaching problem whose expert demonstrations cover only the goal's neighbourhood
(ReCOIL reaches the goal from states no demonstration visits; BC on the union does not), the expert dataset read from
disk and refused for another task, checkpoints, the registry and bad values."""

from __future__ import annotations

import dataclasses
import io

import numpy as np
import pytest
import torch

from rlrobot.algorithms.offline import OFFLINE_POLICY_KIND, offline_algorithm_names
from rlrobot.algorithms.recoil import BCUnion, BCUnionConfig, ReCOIL, ReCOILConfig, union
from rlrobot.algorithms.registry import algorithm_spec
from rlrobot.config import train_config
from rlrobot.data.transitions import Transitions, from_arrays

GOAL = 0.5


def reaching_episodes(kind: str, episodes: int, length: int, seed: int) -> Transitions:
    """A point x in [-1, 1] moved by x' = x + 0.1 a. ``expert``: starts in [0.2, 0.8] and steers to 0.5 (a = 10 (0.5 -
    x) clipped); ``random``: starts anywhere and acts uniformly. Episodes time out; no rewards are used."""
    rng = np.random.default_rng(seed)
    states, actions, index = [], [], []
    for e in range(episodes):
        x = rng.uniform(0.2, 0.8) if kind == "expert" else rng.uniform(-1, 1)
        for _ in range(length):
            a = np.clip(10 * (GOAL - x), -1, 1) if kind == "expert" else rng.uniform(-1, 1)
            states.append([x]), actions.append([a]), index.append(e)
            x = float(np.clip(x + 0.1 * a, -1, 1))
    s, a, e = np.asarray(states, np.float32), np.asarray(actions, np.float32), np.asarray(index)
    last = np.ones(len(e), bool)
    last[:-1] = e[1:] != e[:-1]
    n = len(e)
    return from_arrays(s, a, np.zeros(n, np.float32), e, np.zeros(n, bool), last, np.zeros(n, bool), 0.9,
                       next_state=np.clip(s + 0.1 * a, -1, 1), info={"task": None})


def distance_after_rollout(learner, starts: torch.Tensor, steps: int = 30) -> float:
    x = starts[:, None]
    for _ in range(steps):
        with torch.no_grad():
            x = (x + 0.1 * learner.act({"state": x})).clamp(-1, 1)
    return float((x - GOAL).abs().mean())


def recoil(data, expert, seed: int = 0, **cfg) -> ReCOIL:
    torch.manual_seed(seed)
    return ReCOIL(ReCOILConfig(**{"hidden": (16,), "batch_size": 8, "expert_dataset": "given", **cfg}), 1, 1, data, "cpu",
                  torch.Generator().manual_seed(seed), expert=expert)


# ---------------------------------------------------------------------- the data and the losses
def test_the_union_keeps_both_datasets_episodes_apart():
    a, b = reaching_episodes("random", 3, 4, 0), reaching_episodes("expert", 2, 5, 1)
    u = union(a, b)
    assert len(u) == len(a) + len(b) and u.num_episodes == 5
    assert torch.equal(u.episode_index[len(a):], b.episode_index + 3)
    assert torch.equal(u.episode_end[len(a):], b.episode_end + len(a)) and torch.equal(u.episode_end[:len(a)], a.episode_end)
    assert torch.equal(u.obs["state"][len(a):], b.obs["state"]) and torch.equal(u.mc_returns[:len(a)], a.mc_returns)


def test_critic_targets_are_ls_iqs_bounded_ones():
    """d^E: regression onto q_E = g / (1 - gamma); d^S: TD to -g + gamma V(s') (a termination: -gamma q_E), rewards
    unused; each half weighted 1/2 and summed over the twin critics."""
    data, expert = reaching_episodes("random", 4, 5, 0), reaching_episodes("expert", 2, 5, 1)
    algo = recoil(data, expert, gamma=0.8, reward_gap=2.0)
    assert algo.cfg.expert_value == pytest.approx(10.0)
    mixed = dataclasses.replace(data.index(torch.arange(4)), terminals=torch.tensor([False, True, False, False]),
                                rewards=torch.full((4,), 123.0))
    demo = expert.index(torch.arange(3))
    out = algo.losses(mixed, demo)
    with torch.no_grad():
        s, s_next, s_e = algo.normalize(mixed.obs), algo.normalize(mixed.next_obs), algo.normalize(demo.obs)
        next_v = algo.networks["value"](s_next).squeeze(-1)
        y = torch.where(mixed.terminals, -2.0 - 0.8 * 10.0, -2.0 + 0.8 * next_v)
        q, q_e = algo.networks["critic"](s, mixed.actions), algo.networks["critic"](s_e, demo.actions)
        hand = sum(0.5 * ((q_e[i] - 10.0) ** 2).mean() + 0.5 * ((q[i] - y) ** 2).mean() for i in range(2))
    assert out["critic"].item() == pytest.approx(hand.item(), rel=1e-5)


# ---------------------------------------------------------------------- learning
def test_recoil_imitates_from_states_the_demonstrations_never_visit():
    """5 expert episodes in [0.2, 0.8] and 200 random ones; rollouts of 30 steps from x in [-1, -0.5], which only the
    random data visits. Mean final distance from the goal after 2,000 steps (64x64, gamma 0.9, Gumbel temperature 1,
    the reference's lr 3e-4), seeds 0-2: ReCOIL 0.001, 0.010, 0.001 (at lr 1e-3 it swings between 0.002 and 1.5 from
    one 250-step check to the next); BC on the union 1.14 (it copies the random actions there)."""
    arbitrary, expert = reaching_episodes("random", 200, 20, 0), reaching_episodes("expert", 5, 20, 1)
    algo = recoil(arbitrary, expert, hidden=(64, 64), lr=3e-4, batch_size=256, gamma=0.9, value_temperature=1.0)
    torch.manual_seed(0)
    bc = BCUnion(BCUnionConfig(hidden=(64, 64), lr=1e-3, expert_dataset="given"), 1, 1, arbitrary, "cpu",
                 torch.Generator().manual_seed(0), expert=expert)
    for _ in range(2000):
        stats = algo.update()
        bc.update()
    starts = torch.linspace(-1.0, -0.5, 64)
    d_recoil, d_bc = distance_after_rollout(algo, starts), distance_after_rollout(bc, starts)
    assert d_recoil < 0.1 and d_bc > 0.8, (d_recoil, d_bc)
    assert stats["q_expert"] > 15.0 and stats["q"] < stats["q_expert"]  # the expert's Q near q_E = 20, the data's below


# ---------------------------------------------------------------------- the expert dataset on disk
@pytest.fixture(scope="module")
def reach_datasets(tmp_path_factory):
    from rlrobot.commands.collect import CollectArgs, collect_demonstrations

    root = tmp_path_factory.mktemp("recoil")
    collect_demonstrations(CollectArgs(task="so101-reach", episodes=2, out=str(root / "noisy"), num_envs=2, noise=0.3))
    collect_demonstrations(CollectArgs(task="so101-reach", episodes=2, out=str(root / "expert"), num_envs=2))
    collect_demonstrations(CollectArgs(task="so101-push", episodes=1, out=str(root / "push"), num_envs=1))
    return root


COMMON = dict(task="so101-reach", logger="none", video=False, eval_episodes=2, eval_envs=2, num_threads=1,
              max_episode_steps=20, update_threads=1, num_envs=1)


@pytest.mark.parametrize("algo", ["recoil", "bc-union"])
def test_a_run_reads_the_expert_dataset_and_trains_on_the_union(algo, reach_datasets, tmp_path):
    from rlrobot.runners.base import make_runner

    cfg = train_config(algo, **COMMON, dataset=str(reach_datasets / "noisy"), out=str(tmp_path / algo))
    section = dataclasses.replace(cfg.algorithm, gradient_steps=4, updates_per_iteration=2, batch_size=16, hidden=(16,),
                                  expert_dataset=str(reach_datasets / "expert"), expert_episodes=1)
    setattr(cfg, cfg.spec.config_field, section)
    runner = make_runner(cfg)
    from rlrobot.data.transitions import dataset_meta

    info, _ = dataset_meta(reach_datasets / "expert")
    noisy_frames = runner.data.episode_stats()["transitions"]
    assert len(runner.algo.data) == noisy_frames + info["total_frames"] // info["total_episodes"]  # one expert episode
    assert runner.algo.data.num_episodes == 3
    runner.learn()


def test_an_expert_dataset_of_another_task_is_refused(reach_datasets, tmp_path):
    from rlrobot.runners.base import make_runner

    cfg = train_config("recoil", **COMMON, dataset=str(reach_datasets / "noisy"), out=str(tmp_path / "r"))
    cfg.recoil = dataclasses.replace(cfg.recoil, expert_dataset=str(reach_datasets / "push"))
    with pytest.raises(ValueError, match="recorded on task='so101-push'"):
        make_runner(cfg)


# ---------------------------------------------------------------------- checkpoints, registry, bad values
def test_checkpoint_round_trip_continues_the_same_run():
    data, expert = reaching_episodes("random", 4, 5, 0), reaching_episodes("expert", 2, 5, 1)
    algo = recoil(data, expert)
    for _ in range(3):
        algo.update()
    buffer = io.BytesIO()
    torch.save({"weights": algo.policy.state_dict(), "state": algo.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer)
    acting = ReCOIL(algo.cfg, 1, 1, None, "cpu")
    acting.policy.load_state_dict(saved["weights"])
    acting.load_state_dict(saved["state"])
    obs = {"state": torch.randn(5, 1)}
    assert torch.equal(acting.policy.act(obs), algo.policy.act(obs)) and acting.updates == 3
    resumed = recoil(data, expert, seed=5)
    resumed.policy.load_state_dict(saved["weights"])
    resumed.load_state_dict(saved["state"])
    resumed.generator.set_state(algo.generator.get_state())
    algo.update()
    resumed.update()
    for (name, a), b in zip(algo.policy.state_dict().items(), resumed.policy.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_the_registry_and_the_presets():
    from rlrobot.configs import preset

    for name, learner in (("recoil", ReCOIL), ("bc-union", BCUnion)):
        spec = algorithm_spec(name)
        assert spec.learner is learner and not spec.needs_rewards and spec.policy_kind == OFFLINE_POLICY_KIND
        assert name in offline_algorithm_names() and spec.config.expert_recipe == "expert"
    for task in ("so101-push", "so101-lift"):
        r, b, iql = preset(task, "recoil"), preset(task, "bc-union"), preset(task, "iql")
        assert r.recoil.expert_episodes == b.bc_union.expert_episodes == 10
        assert (r.recoil.gradient_steps, r.recoil.hidden, r.recoil.gamma) == (iql.iql.gradient_steps, iql.iql.hidden, 0.9)
        assert r.recoil.expert_value == pytest.approx(20.0)


def test_offline_bench_passes_the_tasks_expert_recipe(tmp_path):
    from rlrobot.commands.offline_bench import OfflineBenchArgs, run_config

    args = OfflineBenchArgs(data_root=str(tmp_path))
    expert = tmp_path / "so101-push_expert"
    (expert / "meta").mkdir(parents=True)
    (expert / "meta" / "rlrobot.json").write_text("{}")  # an existing dataset is not rewritten
    cfg = run_config(args, "so101-push", "recoil", 0, tmp_path / "so101-push_noisy", tmp_path / "out")
    assert cfg.recoil.expert_dataset == str(expert)
    assert not hasattr(run_config(args, "so101-push", "iql", 0, tmp_path / "d", tmp_path / "o").iql, "expert_dataset")


@pytest.mark.parametrize(("field", "value", "match"), [
    ("expert_dataset", "", r"algo='recoil' needs --recoil.expert-dataset DIR"),
    ("expert_episodes", -1, r"recoil.expert_episodes must be >= 0"),
    ("value_loss", "kl", r"recoil.value_loss='kl' is not one of"),
    ("value_temperature", 0.0, r"recoil.value_temperature must be"),
    ("gamma", 1.0, r"recoil.gamma must be < 1"), ("reward_gap", 0.0, r"recoil.reward_gap must be"),
    ("beta", -1.0, r"recoil.beta must be"), ("tau", 0.0, r"recoil.tau must be"),
])
def test_bad_values_are_refused_naming_the_field(field, value, match):
    run = train_config("recoil", task="so101-push", dataset="somewhere")
    run.recoil.expert_dataset = "demos"
    setattr(run.recoil, field, value)
    with pytest.raises(ValueError, match=match):
        run.validate()


def test_bc_union_needs_the_expert_dataset_too():
    run = train_config("bc-union", task="so101-push", dataset="somewhere")
    with pytest.raises(ValueError, match=r"algo='bc-union' needs --bc-union.expert-dataset DIR"):
        run.validate()
