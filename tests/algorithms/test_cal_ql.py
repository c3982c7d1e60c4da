"""Cal-QL: the conservative regulariser floors the policy actions' Q-values at the data's MC returns."""

import math

import pytest
import torch

from rlrobot.algorithms.cal_ql import CalQL, CalQLConfig, calibrated, conservative_penalty
from rlrobot.data.transitions import synthetic_transitions


def test_the_regulariser_uses_max_q_and_mc_return_as_the_floor():
    torch.manual_seed(0)
    c, b, k, a_dim = 2, 3, 4, 2
    q_data = torch.randn(c, b)
    q_rand, q_pi, q_next = torch.randn(c, b, k), torch.randn(c, b, k) - 5.0, torch.randn(c, b, k) - 5.0
    logp, logp_next = torch.randn(b, k), torch.randn(b, k)
    mc = torch.tensor([0.0, 10.0, -100.0])  # state 1: above every Q (floor binds), state 2: below every Q
    assert torch.equal(calibrated(q_pi, mc), torch.maximum(q_pi, mc[:, None]))
    cal = conservative_penalty(q_data, q_rand, q_pi, logp, q_next, logp_next, a_dim, 1.0, mc)
    cql = conservative_penalty(q_data, q_rand, q_pi, logp, q_next, logp_next, a_dim, 1.0, None)
    # by hand: log-sum-exp over uniform actions (density 0.5^A) and policy actions at s and s', floored
    uniform = q_rand - a_dim * math.log(0.5)
    floored = torch.cat([uniform, torch.maximum(q_pi, mc[:, None]) - logp, torch.maximum(q_next, mc[:, None]) - logp_next], -1)
    assert torch.allclose(cal, torch.logsumexp(floored, -1) - q_data)
    assert torch.all(cal[:, 1] > cql[:, 1] + 1.0)  # the floor raised the policy actions' values: a larger penalty ...
    assert torch.allclose(cal[:, 2], cql[:, 2])  # ... and changes nothing where the MC return is below every Q


def test_cal_ql_trains_and_reports_the_floored_share():
    import numpy as np

    data = synthetic_transitions((20,) * 4, obs_dim=3, action_dim=2)
    algo = CalQL(CalQLConfig(hidden=(16,), num_actions=3, batch_size=32), 3, 2, data, "cpu", torch.Generator().manual_seed(0))
    log_alpha = algo.log_alpha.item()
    first = algo.update()
    # the synthetic rewards are negative, so every MC return lies below the untrained Q ~ 0: nothing floored at first
    assert data.mc_returns.max() < 0.0 and first["floored_share"] == 0.0
    # the figure is the temperature the actor loss used: exp(log_alpha) before this update's temperature step
    assert first["alpha"] == pytest.approx(math.exp(log_alpha), rel=1e-6) and algo.log_alpha.item() != log_alpha
    for _ in range(20):
        before = algo.log_alpha.exp().item()
        stats = algo.update()
        assert stats["alpha"] == pytest.approx(before, rel=1e-6)
    assert all(math.isfinite(v) for v in stats.values())
    # rewards far above any Q: every policy action's value is floored at its MC return at first
    high = synthetic_transitions((20,) * 4, obs_dim=3, action_dim=2, rewards=np.full(80, 10.0, np.float32))
    floored = CalQL(CalQLConfig(hidden=(16,), num_actions=3, batch_size=32), 3, 2, high, "cpu",
                    torch.Generator().manual_seed(0)).update()["floored_share"]
    assert floored == 1.0
    assert algo.updates == 21 and algo.act(data.obs).abs().max() <= 1.0
