import gymnasium
import numpy as np
import pytest
import torch

import rlrobot


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_pendulum_actions_are_rescaled_and_autoreset(mode):
    """Against plain gymnasium Pendulum-v1 envs seeded as the vector env seeds its members (seed + i): actions 1 and
    -0.5 in [-1, 1] are the torques 2 and -1 of the [-2, 2] Box, step for step, through the 200-step time limit; the
    finished episode's last observation is final_obs, the next episode's first is the returned obs."""
    env = rlrobot.make("gym:Pendulum-v1", 2, seed=0, vectorization_mode=mode)
    refs = [gymnasium.make("Pendulum-v1") for _ in range(2)]
    obs, _ = env.reset(seed=0)
    ref_obs = np.stack([ref.reset(seed=i)[0] for i, ref in enumerate(refs)])
    np.testing.assert_array_equal(obs["state"].numpy(), ref_obs)
    action, torque = torch.tensor([[1.0], [-0.5]]), [np.array([2.0], np.float32), np.array([-1.0], np.float32)]
    ref_return = np.zeros(2)
    for t in range(200):
        obs, reward, term, trunc, info = env.step(action)
        steps = [ref.step(u) for ref, u in zip(refs, torque, strict=True)]
        ref_obs = np.stack([s[0] for s in steps])
        np.testing.assert_array_equal(info["final_obs"]["state"].numpy(), ref_obs, err_msg=f"step {t}")
        np.testing.assert_allclose(reward.numpy(), [s[1] for s in steps], rtol=1e-6, atol=1e-6)
        ref_return += [s[1] for s in steps]
        assert trunc.tolist() == [s[3] for s in steps] and not term.any()
    assert trunc.all() and info["episode"]["length"].tolist() == [200, 200]
    np.testing.assert_allclose(info["episode"]["return"].numpy(), ref_return, rtol=1e-5)
    # the autoreset drew each env's next start from its own generator, as reset() without a seed does
    np.testing.assert_array_equal(obs["state"].numpy(), np.stack([ref.reset()[0] for ref in refs]))
    assert not np.allclose(obs["state"].numpy(), ref_obs)
    env.close()


def test_halfcheetah_v5_matches_gymnasium():
    """HalfCheetah-v5's Box is [-1, 1] already: observations and rewards equal gymnasium's for the same seeds and
    actions."""
    env = rlrobot.make("gym:HalfCheetah-v5", 2, seed=0)
    refs = [gymnasium.make("HalfCheetah-v5") for _ in range(2)]
    obs, _ = env.reset(seed=0)
    assert obs["state"].shape == (2, 17) and env.single_action_space.shape == (6,)
    np.testing.assert_array_equal(obs["state"].numpy(), np.stack([ref.reset(seed=i)[0] for i, ref in enumerate(refs)]
                                                                 ).astype(np.float32))
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        action = torch.rand(2, 6, generator=gen) * 2 - 1
        obs, r, *_ = env.step(action)
        steps = [ref.step(a.double().numpy()) for ref, a in zip(refs, action, strict=True)]
        np.testing.assert_allclose(obs["state"].numpy(), np.stack([s[0] for s in steps]).astype(np.float32), rtol=1e-6,
                                   atol=1e-6)
        np.testing.assert_allclose(r.numpy(), [s[1] for s in steps], rtol=1e-5, atol=1e-5)
        assert abs(float(r[0] - r[1])) > 1e-3  # each env its own state
    env.close()


def test_bad_vectorization_mode():
    with pytest.raises(ValueError, match="vectorization_mode"):
        rlrobot.make("gym:Pendulum-v1", 2, vectorization_mode="ray")
