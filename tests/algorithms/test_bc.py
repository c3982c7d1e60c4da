"""Gaussian-MLP behaviour cloning: it recovers the behaviour policy's mean action."""

import numpy as np
import torch

from rlrobot.algorithms.bc import BC, BCConfig
from rlrobot.data.transitions import synthetic_transitions


def test_bc_recovers_the_behaviour_mean():
    torch.manual_seed(0)
    data = synthetic_transitions((50,) * 8, obs_dim=4, action_dim=2, seed=1)  # a = tanh(W s) + N(0, 0.1^2)
    bc = BC(BCConfig(hidden=(64, 64), lr=3e-3, batch_size=256), 4, 2, data, "cpu", torch.Generator().manual_seed(0))
    before = (bc.act(data.obs) - data.actions).abs().mean().item()
    for _ in range(300):
        stats = bc.update()
    err = (bc.act(data.obs) - data.actions).abs().mean().item()
    assert np.isfinite(stats["bc_nll"]) and err < 0.12 < before  # the noise alone is 0.08 mean absolute error
