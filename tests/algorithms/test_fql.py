"""Flow Q-learning: the flow and its one-step distillation, the TD target, the actor's Q term, and a small seeded
learning run (rlrobot/algorithms/fql.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from rlrobot.algorithms.fql import FQL, Critic, FQLConfig, flow_matching_loss, td_target
from rlrobot.algorithms.registry import algorithm_spec
from rlrobot.config import train_config
from rlrobot.data.transitions import from_arrays

from .offline_bandit import bandit_transitions, mean_distance_to_best


def bimodal_transitions(n: int = 1024, seed: int = 0):
    """Actions at +-0.5 (random sign, small noise) whatever the state: the flow's noise -> action map is far from
    constant (noise on one side goes to one mode), so a one-step copy of it cannot match by accident."""
    rng = np.random.default_rng(seed)
    s = rng.uniform(-1, 1, size=(n, 2)).astype(np.float32)
    a = (np.sign(rng.uniform(-1, 1, size=(n, 1))) * 0.5 + 0.05 * rng.normal(size=(n, 2))).astype(np.float32)
    ends = np.ones(n, bool)
    return from_arrays(s, a, np.zeros(n, np.float32), np.arange(n), ends, ~ends, np.zeros(n, bool), gamma=0.99)


def test_one_step_policy_matches_the_flow_when_the_q_term_is_off():
    """q_weight = 0: the one-step policy is trained only to copy ODE(s, z). After the BC flow has learnt a fixed
    (frozen) noise -> action map, mu(s, z) reproduces it for fresh noise within 0.03 (mean |difference|; 0.01
    measured), where at initialisation they differed by > 0.3, and the flow's actions spread over both modes."""
    data = bimodal_transitions()
    algo = FQL(FQLConfig(hidden=(64, 64), q_weight=0.0, alpha=10.0, batch_size=128, lr=1e-3, flow_steps=5), 2, 2, data,
               "cpu", torch.Generator().manual_seed(0))
    s = algo.normalize(data.obs)[:256]
    z = torch.randn(256, 2, generator=torch.Generator().manual_seed(1))

    def gap() -> float:
        with torch.no_grad():
            return float((algo.onestep_actions(s, z) - algo.flow_actions(s, z)).abs().mean())

    for _ in range(150):  # the flow learns the two modes (the one-step policy follows)
        algo.update()
    algo.networks["bc_flow"].requires_grad_(False)  # fix the noise -> action map
    flow = algo.flow_actions(s, z)
    initial = FQL(algo.cfg, 2, 2, data, "cpu")
    with torch.no_grad():
        assert float((initial.onestep_actions(s, z) - flow).abs().mean()) > 0.3
    for _ in range(150):
        algo.update()
    assert torch.equal(algo.flow_actions(s, z), flow)  # the map stayed fixed
    assert float(flow[:, 0].std()) > 0.3  # not a constant: noise picks the mode
    assert gap() < 0.03, gap()


def test_flow_matching_loss_is_zero_for_the_straight_path_velocity():
    """On x^f = (1 - f) z + f a the target velocity is a - z: v(x, f) = (a - x) / (1 - f) gives exactly that (loss 0),
    v = 0 costs E (a - z)^2, and a mask leaves padded entries out."""
    torch.manual_seed(0)
    a, z, f = torch.rand(32, 3) * 2 - 1, torch.randn(32, 3), torch.rand(32, 1) * 0.9
    assert float(flow_matching_loss(lambda obs, x, t: (a - x) / (1 - t), None, a, z, f)) < 1e-10
    assert torch.allclose(flow_matching_loss(lambda obs, x, t: torch.zeros_like(x), None, a, z, f), (a - z).square().mean())
    mask = torch.zeros(32, 3)
    mask[:, 0] = 1
    masked = flow_matching_loss(lambda obs, x, t: torch.zeros_like(x), None, a, z, f, mask)
    assert torch.allclose(masked, (a - z)[:, 0].square().sum() / a.numel())


def test_td_target_bootstraps_time_outs_not_terminals():
    rewards, next_q = torch.tensor([1.0, 1.0, 1.0]), torch.tensor([10.0, 10.0, 10.0])
    terminals = torch.tensor([False, True, False])  # a mid-episode step, a termination, a time-out (not terminal)
    assert torch.allclose(td_target(rewards, terminals, 0.9, next_q), torch.tensor([10.0, 1.0, 10.0]))


def test_critics_get_no_gradient_from_the_actor_loss_and_targets_are_polyak_averaged():
    data = bandit_transitions(256, seed=0)
    torch.manual_seed(0)  # network initialisation
    algo = FQL(FQLConfig(hidden=(32,), batch_size=64, tau=0.1, alpha=0.0), 2, 2, data, "cpu",
               torch.Generator().manual_seed(0))
    critic0 = [p.clone() for p in algo.networks["critic"].parameters()]
    target0 = [p.clone() for p in algo.networks["target_critic"].parameters()]
    onestep0 = [p.clone() for p in algo.networks["onestep"].parameters()]
    stats = algo.update()
    for t0, c, t in zip(target0, algo.networks["critic"].parameters(),
                         algo.networks["target_critic"].parameters(), strict=True):
        assert torch.allclose(t, 0.9 * t0 + 0.1 * c, atol=1e-7)
    # with alpha = 0 the one-step policy moves only through the Q term
    assert any(not torch.equal(p0, p) for p0, p in zip(onestep0, algo.networks["onestep"].parameters(), strict=True))
    assert stats["q_loss"] != 0.0
    # the critic's step came from the TD loss alone: recompute it with the actor loss left out
    torch.manual_seed(0)
    ref = FQL(FQLConfig(hidden=(32,), batch_size=64, tau=0.1, alpha=0.0), 2, 2, data, "cpu",
              torch.Generator().manual_seed(0))
    for p, p0 in zip(ref.networks["critic"].parameters(), critic0, strict=True):
        assert torch.equal(p, p0)
    ref.networks["onestep"].requires_grad_(False)
    ref.networks["bc_flow"].requires_grad_(False)
    ref.update()
    for p, q in zip(ref.networks["critic"].parameters(), algo.networks["critic"].parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6)


def test_critic_ensemble_evaluates_members_independently():
    critic = Critic(obs_dim=3, action_dim=2, hidden=(16, 16), members=2)
    obs, action = torch.randn(5, 3), torch.randn(5, 2)
    q = critic(obs, action)
    assert q.shape == (2, 5) and not torch.allclose(q[0], q[1])
    with torch.no_grad():  # member 1 has its own weights: zeroing them leaves member 0 alone
        for w in critic.net.weights:
            w[1].zero_()
    q2 = critic(obs, action)
    assert torch.equal(q2[0], q[0]) and torch.allclose(q2[1], torch.zeros(5))


def test_act_samples_z_as_the_reference_evaluates_and_checkpoints_round_trip():
    data = bandit_transitions(64, seed=0)
    cfg = FQLConfig(hidden=(16,), batch_size=16)
    algo = FQL(cfg, 2, 2, data, "cpu", torch.Generator().manual_seed(0))
    algo.update()
    obs = {"state": torch.randn(7, 2) * 3}
    torch.manual_seed(4)
    a = algo.act(obs)
    assert a.shape == (7, 2) and float(a.abs().max()) <= 1.0
    assert not torch.equal(a, algo.act(obs))  # z ~ N(0, I) on every call, deterministic or not
    z = torch.randn(7, 2, generator=torch.Generator().manual_seed(9))
    torch.manual_seed(9)
    assert torch.equal(algo.act(obs), algo.onestep_actions(algo.normalize(obs), z))
    zero = FQL(dataclasses.replace(cfg, act_noise="zero"), 2, 2, None, "cpu")
    zero.networks.load_state_dict(algo.networks.state_dict())
    assert torch.equal(zero.act(obs), algo.onestep_actions(algo.normalize(obs), torch.zeros(7, 2)))
    loaded = FQL(cfg, 2, 2, None, "cpu")
    loaded.networks.load_state_dict(algo.networks.state_dict())
    loaded.load_state_dict(algo.state_dict())
    torch.manual_seed(4)
    assert torch.equal(loaded.act(obs), a) and loaded.updates == 1
    assert algorithm_spec("fql").learner is FQL


@pytest.mark.parametrize(("field", "value", "match"), [
    ("alpha", -1.0, "fql.alpha"), ("flow_steps", 0, "fql.flow_steps must be >= 1"), ("tau", 0.0, r"fql.tau must be in"),
    ("q_agg", "max", "fql.q_agg='max' is not one of"), ("act_noise", "mean", "fql.act_noise='mean' is not one of"),
])
def test_bad_config_is_refused_naming_the_field(field, value, match):
    run = train_config("fql", task="so101-push", dataset="somewhere")
    setattr(run.fql, field, value)
    with pytest.raises(ValueError, match=match):
        run.validate()


def test_fql_learns_the_best_action_of_a_noisy_bandit():
    """Uniform random actions, reward -|a - 0.6 s|^2, one step: behaviour cloning acts near the data's mean (0, mean
    distance 0.46 from the best action; the data's own actions 0.8). FQL's Q term moves the one-step policy to within
    0.25 of the best action in 400 small updates (seeded; 0.15-0.19 measured over 3 seeds)."""
    data = bandit_transitions(2048, seed=1)
    algo = FQL(FQLConfig(hidden=(64, 64), alpha=0.03, batch_size=128, lr=1e-3, flow_steps=5), 2, 2, data, "cpu",
               torch.Generator().manual_seed(0))
    s = torch.rand(512, 2, generator=torch.Generator().manual_seed(2)) * 2 - 1
    assert 0.4 < mean_distance_to_best(torch.zeros(512, 2), s) < 0.5  # where BC's z = 0 action lands
    assert mean_distance_to_best(data.actions, data.obs["state"]) > 0.7
    for _ in range(400):
        algo.update()
    error = mean_distance_to_best(algo.act({"state": s}), s)
    assert error < 0.25, error
