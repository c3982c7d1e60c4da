"""Reversal Q-learning: reversed flows, h-step targets from the loader's windows, ensemble pessimism, the EMA actor,
and a small seeded learning run (rlrobot/algorithms/rql.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rlrobot.algorithms.fql import VectorField, aggregate, integrate_flow
from rlrobot.algorithms.rql import RQL, RQLConfig, h_step_target, lookahead, reverse_flow, sample_depth
from rlrobot.config import train_config

from .offline_bandit import bandit_transitions, chain_transitions, mean_distance_to_best


# ------------------------------------------------------------------------------------------ reversed flows
def test_reversing_a_known_linear_flow_returns_the_exact_partial_action():
    """The straight path x^f = (1 - f) z + f a has velocity v(x, f) = (x - z) / f; reversing it from a by depth d in
    F Euler steps lands exactly on x^{1-d}, for every depth (grid, off-grid, 0 and 1)."""
    torch.manual_seed(0)
    z, a = torch.randn(6, 4, dtype=torch.float64), torch.rand(6, 4, dtype=torch.float64) * 2 - 1
    depth = torch.tensor([0.0, 0.1, 0.37, 0.5, 0.93, 1.0], dtype=torch.float64)

    def velocity(obs, x, f):
        return (x - z) / f

    x_f, f = reverse_flow(velocity, torch.zeros(6, 1), a, depth, steps=10)
    assert torch.allclose(f.squeeze(1), 1.0 - depth, atol=1e-12)
    assert torch.allclose(x_f, (1.0 - f) * z + f * a, atol=1e-12)
    assert torch.equal(x_f[0], a[0])  # depth 0: the data action itself
    assert torch.allclose(x_f[-1], z[-1], atol=1e-12)  # depth 1: back to the noise


def test_reversal_through_the_actor_network_then_forward_returns_the_data_chunk():
    """A VectorField whose output is a constant c (all weights 0, last bias c) is the linear flow from z = a - c:
    reversal gives a - d c, and integrating the same flow forward from the noise gives a back."""
    net = VectorField(obs_dim=3, action_dim=2, hidden=(8,))
    c = torch.tensor([0.3, -0.8])
    with torch.no_grad():
        for p in net.parameters():
            p.zero_()
        net.net.biases[-1].copy_(c.view(1, 1, 2))
    obs, a = torch.randn(4, 3), torch.tensor([[0.5, 0.1], [-0.2, 0.4], [0.9, -0.9], [0.0, 0.0]])
    depth = torch.tensor([0.25, 0.5, 0.8, 1.0])
    x_f, f = reverse_flow(net, obs, a, depth, steps=10)
    assert torch.allclose(x_f, a - depth[:, None] * c, atol=1e-6)
    assert torch.allclose(integrate_flow(net, obs, a - c, steps=10, clip=False), a, atol=1e-6)


def test_depths_are_half_uniform_half_on_the_flow_grid():
    d = sample_depth(1000, 10, torch.Generator().manual_seed(0))
    uniform, grid = d[:500], d[500:]
    assert 0.0 <= float(uniform.min()) and float(uniform.max()) <= 1.0
    assert not torch.allclose(uniform * 10, (uniform * 10).round())  # off the grid
    # spread evenly over [0, 1]: 50 expected in each tenth (binomial sd 6.7), 42-57 drawn
    assert all(30 <= c <= 70 for c in torch.histc(uniform, 10, 0.0, 1.0).tolist())
    assert torch.allclose(grid * 10, (grid * 10).round(), atol=1e-6)
    counts = torch.bincount((grid * 10).round().long(), minlength=11)
    assert len(counts) == 11 and all(25 <= c <= 65 for c in counts.tolist())  # 0 ... 1, each 45 expected (40-54 drawn)


def test_lookahead_stops_at_the_action():
    x, v = torch.zeros(3, 2), torch.ones(3, 2)
    f = torch.tensor([[0.0], [0.95], [1.0]])
    x_next, f_next = lookahead(x, v, f, steps=10)
    assert torch.allclose(f_next, torch.tensor([[0.1], [1.0], [1.0]]))
    assert torch.allclose(x_next[:, 0], torch.tensor([0.1, 0.05, 0.0]))


# ------------------------------------------------------------------------------------------ targets
def test_h_step_target_by_hand():
    gamma, v = 0.9, torch.full((3,), 10.0)
    rewards = torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.0, 7.0], [5.0, 7.0, 7.0]])
    valid = torch.tensor([[True, True, True], [True, True, False], [True, False, False]])
    terminals, discount_h = torch.tensor([False, True, False]), torch.tensor([gamma ** 3, gamma ** 2, gamma])
    y = h_step_target(rewards, valid, terminals, discount_h, v, gamma)
    # full window; terminated after 2 steps (no bootstrap, the 7 past the end ignored); timed out after 1 (bootstraps)
    assert torch.allclose(y, torch.tensor([1 + 0.9 * 2 + 0.81 * 3 + 0.729 * 10, 1 + 0.9 * 2, 5 + 0.9 * 10]))


def test_h_step_targets_on_the_loaders_windows():
    """A hand-made sequence through the loader's TransitionChunks: episode 0 (rewards 1, 2, 3, 4) terminates, episode 1
    (rewards 10, 20, 30) times out. Windows of h = 3 sum rewards with gamma, bootstrap with gamma^h inside an
    episode, not after the terminal, with gamma^k after the time-out."""
    gamma = 0.5
    data = chain_transitions([[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 30.0]], terminated=[True, False], gamma=gamma)
    chunks = data.sample_chunks(4000, 3, torch.Generator().manual_seed(0))
    next_v = chunks.next_obs["state"][:, 0] * 100  # V(s') = 100 * (frame index of s'), to see where it bootstraps
    y = h_step_target(chunks.rewards, chunks.valid, chunks.terminals, chunks.discount_h, next_v, gamma)
    start = chunks.obs["state"][:, 0].long()
    expected = {0: 1 + 0.5 * 2 + 0.25 * 3 + 0.125 * 300,  # frames 0-2, bootstrap from frame 3
                1: 2 + 0.5 * 3 + 0.25 * 4,  # frames 1-3, terminal at 3: no bootstrap
                2: 3 + 0.5 * 4, 3: 4.0,
                4: 10 + 0.5 * 20 + 0.25 * 30 + 0.125 * 600,  # time-out after frame 6: bootstrap from frame 6
                5: 20 + 0.5 * 30 + 0.25 * 600, 6: 30 + 0.5 * 600}
    assert set(start.tolist()) == set(expected)
    for frame, value in expected.items():
        assert torch.allclose(y[start == frame], torch.tensor(value)), frame
    assert torch.allclose(chunks.discount_h[start == 0], torch.tensor(gamma ** 3))


# ------------------------------------------------------------------------------------------ pessimism
def test_ensemble_pessimism_is_mean_minus_rho_std():
    values = torch.tensor([[1.0, 2.0], [3.0, 6.0]])  # members x batch
    assert torch.allclose(aggregate(values, "mean", rho=0.0), torch.tensor([2.0, 4.0]))
    assert torch.allclose(aggregate(values, "mean", rho=0.5), torch.tensor([2.0 - 0.5, 4.0 - 0.5 * 2.0]))
    assert torch.allclose(aggregate(values, "min"), torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="max"):
        aggregate(values, "max")


def test_rho_lowers_the_target_by_the_ensemble_spread():
    """The target the critic regresses on uses mean - rho std of the target values at s'."""
    data = bandit_transitions(64, seed=0, terminal=False)
    algos = [RQL(RQLConfig(hidden=(16,), horizon=1, rho=rho, num_values=4, batch_size=32), 2, 2, data, "cpu",
                 torch.Generator().manual_seed(0)) for rho in (0.0, 1.0)]
    algos[1].networks.load_state_dict(algos[0].networks.state_dict())
    stats = [a.update() for a in algos]
    assert stats[1]["target"] < stats[0]["target"] - 1e-4


# ------------------------------------------------------------------------------------------ EMA actor
def test_ema_actor_moves_by_one_minus_decay():
    data = bandit_transitions(64, seed=0)
    algo = RQL(RQLConfig(hidden=(16,), horizon=1, num_values=2, batch_size=32, ema=0.9), 2, 2, data, "cpu",
               torch.Generator().manual_seed(0))
    ema_before = [p.clone() for p in algo.networks["ema_actor"].parameters()]
    assert all(torch.equal(e, p) for e, p in zip(ema_before, algo.networks["actor"].parameters(), strict=True))
    algo.update()
    for e_old, e, p in zip(ema_before, algo.networks["ema_actor"].parameters(), algo.networks["actor"].parameters(),
                           strict=True):
        assert not torch.equal(p, e_old)  # the actor moved
        assert torch.allclose(e, 0.9 * e_old + 0.1 * p, atol=1e-7)
    # acting uses the EMA actor, not the online one
    obs = {"state": torch.randn(5, 2)}
    torch.manual_seed(0)
    ema_action = algo.act(obs)
    algo.networks["ema_actor"].load_state_dict(algo.networks["actor"].state_dict())
    torch.manual_seed(0)
    assert not torch.allclose(ema_action, algo.act(obs))


# ------------------------------------------------------------------------------------------ the learner
def test_act_returns_chunks_in_range_and_checkpoints_round_trip():
    data = bandit_transitions(64, seed=0)
    cfg = RQLConfig(hidden=(16,), horizon=3, num_values=2, batch_size=16)
    algo = RQL(cfg, 2, 2, data, "cpu", torch.Generator().manual_seed(0))
    algo.update()
    obs = {"state": torch.randn(7, 2) * 3}
    torch.manual_seed(4)
    chunk = algo.act(obs)
    assert chunk.shape == (7, 3, 2) and float(chunk.abs().max()) <= 1.0
    assert algo.policy.chunk_size == 3 and algo.policy.sample_actions(obs).shape == (7, 3, 2)
    # z ~ N(0, I) as the reference acts; act_noise='zero' is the deterministic policy
    s = algo.normalize(obs)
    z = torch.randn(7, 6, generator=torch.Generator().manual_seed(9))
    torch.manual_seed(9)
    assert torch.equal(algo.act(obs).flatten(1), integrate_flow(algo.networks["ema_actor"], s, z, cfg.flow_steps))
    zero = RQL(dataclasses.replace(cfg, act_noise="zero"), 2, 2, None, "cpu")
    zero.networks.load_state_dict(algo.networks.state_dict())
    assert torch.equal(zero.act(obs).flatten(1), integrate_flow(algo.networks["ema_actor"], s, torch.zeros(7, 6), cfg.flow_steps))
    loaded = RQL(cfg, 2, 2, None, "cpu")
    loaded.networks.load_state_dict(algo.networks.state_dict())
    loaded.load_state_dict(algo.state_dict())
    torch.manual_seed(4)
    assert torch.equal(loaded.act(obs), chunk) and loaded.updates == 1


@pytest.mark.parametrize(("field", "value", "match"), [
    ("horizon", 0, "rql.horizon must be >= 1"), ("expectile", 1.0, r"rql.expectile must be in \(0, 1\)"),
    ("rho", -1.0, "rql.rho"), ("ema", 1.0, r"rql.ema must be in \[0, 1\)"), ("flow_steps", 0, "rql.flow_steps"),
])
def test_bad_config_is_refused_naming_the_field(field, value, match):
    run = train_config("rql", task="so101-push", dataset="somewhere")
    setattr(run.rql, field, value)
    with pytest.raises(ValueError, match=match):
        run.validate()


def test_rql_learns_the_best_action_of_a_noisy_bandit():
    """Uniform random actions, reward -|a - 0.6 s|^2, one step: behaviour cloning acts near the data's mean (0, mean
    distance 0.46 from the best action; the data's own actions 0.8). RQL's value look-ahead moves the EMA actor to
    within 0.25 of the best action in 400 small updates (seeded; 0.07-0.09 measured over 3 seeds)."""
    data = bandit_transitions(2048, seed=1)
    cfg = RQLConfig(hidden=(64, 64), horizon=1, alpha=0.03, num_values=4, batch_size=128, lr=1e-3, flow_steps=5,
                    ema=0.99)
    algo = RQL(cfg, 2, 2, data, "cpu", torch.Generator().manual_seed(0))
    s = torch.rand(512, 2, generator=torch.Generator().manual_seed(2)) * 2 - 1
    assert 0.4 < mean_distance_to_best(torch.zeros(512, 2), s) < 0.5  # where BC's z = 0 action lands
    assert mean_distance_to_best(data.actions, data.obs["state"]) > 0.7
    for _ in range(400):
        algo.update()
    error = mean_distance_to_best(algo.act({"state": s})[:, 0], s)
    assert error < 0.25, error
