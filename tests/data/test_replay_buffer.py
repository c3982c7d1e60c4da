"""Replay buffer: final-obs handling on truncation / termination, n-step returns, wrap-around, bad input, save/load."""

import pytest
import torch

from rlrobot.data.replay_buffer import ReplayBuffer

F, T = torch.zeros(1, dtype=torch.bool), torch.ones(1, dtype=torch.bool)


def one_env_buffer(capacity=16, n_step=1, gamma=0.5):
    return ReplayBuffer(capacity, 1, {"state": (1,)}, 1, n_step=n_step, gamma=gamma)


def add(buf, s, r, term=False, trunc=False, next_s=None, final_s=None):
    """One step of a 1-env episode whose state is a counter; ``next_s`` is what autoreset returned."""
    next_s = s + 1 if next_s is None else next_s
    final = {"state": torch.tensor([[float(s + 1 if final_s is None else final_s)]])}
    buf.add({"state": torch.tensor([[float(s)]])}, torch.tensor([[0.1 * s]]), torch.tensor([float(r)]),
            T if term else F, T if trunc else F, {"state": torch.tensor([[float(next_s)]])}, final)


def sample_all(buf):
    """Every samplable transition once, by sampling many times and keying on the stored obs."""
    out = {}
    g = torch.Generator().manual_seed(0)
    for _ in range(64):
        batch = buf.sample(buf.num_samplable, g)
        for i in range(batch["actions"].shape[0]):
            out[float(batch["obs"]["state"][i, 0])] = {k: (v["state"][i, 0] if isinstance(v, dict) else v[i])
                                                       for k, v in batch.items()}
    return out


def test_truncated_transition_keeps_final_obs_and_bootstraps():
    buf = one_env_buffer(gamma=0.9)
    add(buf, 0, 1.0)
    add(buf, 1, 1.0, trunc=True, next_s=100, final_s=2)  # autoreset returned 100, the true final obs was 2
    add(buf, 100, 1.0, term=True, next_s=200, final_s=101)
    got = sample_all(buf)
    trunc, term = got[1.0], got[100.0]
    assert trunc["next_obs"] == 2.0  # the final obs, never the reset obs
    assert not trunc["terminated"] and trunc["discount"] == pytest.approx(0.9)  # bootstrapped from V(final)
    assert term["next_obs"] == 101.0
    assert term["terminated"] and term["discount"] == 0.0
    assert got[0.0]["next_obs"] == 1.0 and got[0.0]["discount"] == pytest.approx(0.9)


def test_n_step_returns_on_a_hand_made_sequence():
    # rewards 1, 2, 4, 8, 16 with gamma 0.5, n = 3; the episode is truncated after step 3, terminated after step 5
    buf = one_env_buffer(n_step=3, gamma=0.5)
    add(buf, 0, 1)
    add(buf, 1, 2)
    add(buf, 2, 4)
    add(buf, 3, 8, trunc=True, final_s=4, next_s=10)
    add(buf, 10, 16)
    add(buf, 11, 32, term=True, final_s=12, next_s=20)
    add(buf, 20, 64)
    add(buf, 21, 128)
    got = sample_all(buf)
    # the newest n-1 = 2 steps (obs 20, 21) wait for their future
    assert set(got) == {0.0, 1.0, 2.0, 3.0, 10.0, 11.0}
    # from 0: 1 + .5*2 + .25*4 = 3, bootstrap from obs 3 with gamma^3
    assert got[0.0]["rewards"] == pytest.approx(3.0) and got[0.0]["next_obs"] == 3.0
    assert got[0.0]["discount"] == pytest.approx(0.125) and not got[0.0]["terminated"]
    # from 2: 4 + .5*8, then the truncation ends the window: bootstrap from the final obs 4 with gamma^2
    assert got[2.0]["rewards"] == pytest.approx(8.0) and got[2.0]["next_obs"] == 4.0
    assert got[2.0]["discount"] == pytest.approx(0.25)
    # from 3: the truncated step alone
    assert got[3.0]["rewards"] == pytest.approx(8.0) and got[3.0]["discount"] == pytest.approx(0.5)
    # from 10: 16 + .5*32, terminated: no bootstrap
    assert got[10.0]["rewards"] == pytest.approx(32.0) and got[10.0]["discount"] == 0.0
    assert got[10.0]["next_obs"] == 12.0 and got[10.0]["terminated"]
    # actions are those of the first step of the window
    assert got[10.0]["actions"] == pytest.approx(1.0)


def test_ring_wraps_and_multi_env_columns_stay_separate():
    buf = ReplayBuffer(6, 2, {"state": (1,)}, 1, n_step=2, gamma=1.0)  # 3 rows x 2 envs
    for t in range(5):  # rows overwritten: the oldest rows (t=0, 1) are gone
        s = torch.tensor([[float(t)], [100.0 + t]])
        buf.add({"state": s}, torch.zeros(2, 1), torch.tensor([1.0, 10.0]), torch.zeros(2, dtype=torch.bool),
                torch.zeros(2, dtype=torch.bool), {"state": s + 1}, {"state": s + 1})
    assert len(buf) == 6 and buf.num_samplable == 4
    g = torch.Generator().manual_seed(1)
    parts = [buf.sample(4, g) for _ in range(50)]
    batch = {"obs": {"state": torch.cat([p["obs"]["state"] for p in parts])},
             "next_obs": {"state": torch.cat([p["next_obs"]["state"] for p in parts])},
             "rewards": torch.cat([p["rewards"] for p in parts])}
    obs = batch["obs"]["state"][:, 0]
    assert set(obs.tolist()) == {2.0, 3.0, 102.0, 103.0}  # t=4 waits for its second step
    env1 = obs >= 100
    assert torch.all(batch["rewards"][env1] == 20.0) and torch.all(batch["rewards"][~env1] == 2.0)
    assert torch.equal(batch["next_obs"]["state"][:, 0], obs + 2)


def test_images_are_stored_as_uint8():
    buf = ReplayBuffer(8, 2, {"state": (3,), "image_front": (3, 4, 4)}, 2, obs_dtypes={"image_front": torch.uint8})
    assert buf.obs["image_front"].dtype == torch.uint8 and buf.next_obs["image_front"].dtype == torch.uint8
    img = torch.randint(0, 256, (2, 3, 4, 4), dtype=torch.uint8)
    o = {"state": torch.randn(2, 3), "image_front": img}
    buf.add(o, torch.zeros(2, 2), torch.zeros(2), torch.zeros(2, dtype=torch.bool), torch.zeros(2, dtype=torch.bool), o, o)
    assert torch.equal(buf.obs["image_front"][0], img)


def test_bad_input():
    with pytest.raises(ValueError, match="capacity=3 is smaller than num_envs=4"):
        ReplayBuffer(3, 4, {"state": (1,)}, 1)
    buf = one_env_buffer()
    add(buf, 0, 1.0)
    with pytest.raises(ValueError, match="batch_size=2 is larger than the 1 transitions"):
        buf.sample(2)


def test_state_dict_round_trip():
    buf = one_env_buffer(capacity=4)
    for t in range(6):
        add(buf, t, t)
    tensors, meta = buf.state_dict()
    other = one_env_buffer(capacity=4)
    other.load_state_dict(tensors, meta)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    a, b = buf.sample(4, g1), other.sample(4, g2)
    assert torch.equal(a["rewards"], b["rewards"]) and torch.equal(a["next_obs"]["state"], b["next_obs"]["state"])
    with pytest.raises(ValueError, match="must match"):
        one_env_buffer(capacity=8).load_state_dict(tensors, meta)
