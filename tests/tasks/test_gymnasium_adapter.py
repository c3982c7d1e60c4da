import numpy as np
import pytest
import torch

import rlrobot


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_pendulum_actions_are_rescaled_and_autoreset(mode):
    env = rlrobot.make("gym:Pendulum-v1", 2, seed=0, vectorization_mode=mode)
    obs, _ = env.reset(seed=0)
    assert obs["state"].shape == (2, 3)
    for _ in range(200):
        obs, reward, term, trunc, info = env.step(torch.ones(2, 1))
    assert trunc.all() and not term.any()
    assert info["episode"]["length"].tolist() == [200, 200]
    # final_obs is the end of the finished episode, obs the start of the next
    assert not torch.allclose(info["final_obs"]["state"], obs["state"])
    env.close()


def test_halfcheetah_v5():
    env = rlrobot.make("gym:HalfCheetah-v5", 2, seed=0)
    obs, _ = env.reset(seed=0)
    assert obs["state"].shape == (2, 17) and env.single_action_space.shape == (6,)
    obs, r, *_ = env.step(torch.zeros(2, 6))
    assert np.isfinite(r.numpy()).all()
    env.close()


def test_bad_vectorization_mode():
    with pytest.raises(ValueError, match="vectorization_mode"):
        rlrobot.make("gym:Pendulum-v1", 2, vectorization_mode="ray")
