"""The native batched locomotion tasks against gymnasium's v5 envs, step by step from the same state and actions.

Tolerance: observations equal to gymnasium's float64 observation cast to float32 (atol 0: the same MuJoCo calls on
the same model give bit-identical physics); rewards within 1e-6 absolute (ours are float32 on the way out: the
float32 rounding of rewards of size ~1-10 is below 1e-6); terminated and truncated exactly equal.
"""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
import torch

import rlrobot

TASKS = ("HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5")
REWARD_ATOL = 1e-6


def _gym_obs32(obs: np.ndarray) -> np.ndarray:
    return obs.astype(np.float32)


@pytest.mark.parametrize("gym_id", TASKS)
def test_one_env_reproduces_gymnasium_with_resets(gym_id: str):
    """One env and the same seed: the same reset noise draws, then 300 steps of the same random actions (autoresets
    in ours, gymnasium's reset() without a seed in theirs) give the same observations, rewards and terminations."""
    ref = gymnasium.make(gym_id)
    env = rlrobot.make(f"mujoco-{gym_id}", 1, seed=7)
    try:
        assert env.single_observation_space["state"].shape == ref.observation_space.shape
        assert env.single_action_space.shape == ref.action_space.shape
        obs, _ = env.reset(seed=7)
        ref_obs, _ = ref.reset(seed=7)
        np.testing.assert_array_equal(obs["state"][0].numpy(), _gym_obs32(ref_obs))
        rng = np.random.default_rng(1)
        ends = 0
        for t in range(300):
            action = rng.uniform(-1, 1, env.action_dim).astype(np.float32)
            obs, reward, terminated, truncated, info = env.step(torch.from_numpy(action)[None])
            ref_obs, ref_reward, ref_terminated, ref_truncated, _ = ref.step(action.astype(np.float64))
            np.testing.assert_array_equal(info["final_obs"]["state"][0].numpy(), _gym_obs32(ref_obs), err_msg=f"step {t}")
            assert abs(reward.item() - ref_reward) <= REWARD_ATOL, (t, reward.item(), ref_reward)
            assert (bool(terminated[0]), bool(truncated[0])) == (ref_terminated, ref_truncated), t
            if ref_terminated or ref_truncated:
                ends += 1
                ref_obs, _ = ref.reset()
                np.testing.assert_array_equal(obs["state"][0].numpy(), _gym_obs32(ref_obs), err_msg=f"reset at {t}")
        if gym_id in ("Hopper-v5", "Walker2d-v5"):
            assert ends >= 3  # random actions topple them within ~30 steps: the resets were exercised
    finally:
        env.close()
        ref.close()


@pytest.mark.parametrize("gym_id", ("HalfCheetah-v5", "Ant-v5", "Hopper-v5"))
def test_batch_matches_gymnasium_from_the_same_states(gym_id: str):
    """Four envs in one batch, each against its own gymnasium env started from the same (qpos, qvel): 200 steps."""
    n = 4
    env = rlrobot.make(f"mujoco-{gym_id}", n, seed=0, num_threads=2)
    refs = [gymnasium.make(gym_id) for _ in range(n)]
    try:
        env.reset(seed=0)
        for i, ref in enumerate(refs):
            ref.reset(seed=i)
            ref.unwrapped.set_state(env.datas[i].qpos.copy(), env.datas[i].qvel.copy())
        rng = np.random.default_rng(2)
        for t in range(200):
            actions = rng.uniform(-1, 1, (n, env.action_dim)).astype(np.float32)
            obs, reward, terminated, truncated, info = env.step(torch.from_numpy(actions))
            for i, ref in enumerate(refs):
                ref_obs, ref_reward, ref_terminated, ref_truncated, _ = ref.step(actions[i].astype(np.float64))
                np.testing.assert_array_equal(info["final_obs"]["state"][i].numpy(), _gym_obs32(ref_obs),
                                              err_msg=f"env {i} step {t}")
                assert abs(reward[i].item() - ref_reward) <= REWARD_ATOL, (i, t)
                assert bool(terminated[i]) == ref_terminated and bool(truncated[i]) == ref_truncated, (i, t)
                if ref_terminated or ref_truncated:  # continue the reference from our new episode's first state
                    ref.reset()
                    ref.unwrapped.set_state(env.datas[i].qpos.copy(), env.datas[i].qvel.copy())
    finally:
        env.close()
        for ref in refs:
            ref.close()


def test_truncation_and_reset_noise_distribution():
    """Time limit: truncated at max_episode_steps (HalfCheetah never terminates); reset noise has gymnasium's scale."""
    env = rlrobot.make("mujoco-HalfCheetah-v5", 256, seed=0, max_episode_steps=5)
    try:
        env.reset(seed=0)
        qpos0 = env.model.qpos0
        dq = env.qpos - qpos0
        assert np.abs(dq).max() <= 0.1 and np.abs(dq).max() > 0.09  # U(-0.1, 0.1)
        assert abs(env.qvel.std() - 0.1) < 0.01  # 0.1 * N(0, 1)
        zero = torch.zeros(256, env.action_dim)
        for t in range(5):
            _, _, terminated, truncated, info = env.step(zero)
            assert not terminated.any()
            assert bool(truncated.all()) == (t == 4)
        assert len(info["episode"]["env_ids"]) == 256 and (info["episode"]["length"] == 5).all()
    finally:
        env.close()


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="obs_mode"):
        rlrobot.make("mujoco-Hopper-v5", 1, obs_mode="rgb")
    with pytest.raises(ValueError, match="control_mode"):
        rlrobot.make("mujoco-Hopper-v5", 1, control_mode="ee_delta")
    with pytest.raises(ValueError, match="frame_skip"):
        rlrobot.make("mujoco-Hopper-v5", 1, frame_skip=2)
    from rlrobot.tasks.locomotion import HopperEnv
    from rlrobot.tasks.mjwarp_backend import mjwarp_task_class

    with pytest.raises(ValueError, match="backend 'mujoco' only"):  # checked before MuJoCo Warp is needed
        mjwarp_task_class(HopperEnv)(1)


def test_a_diverged_simulation_ends_its_episode():
    """MuJoCo counts mjWARN_BADQACC when it resets a diverged MjData; that env's episode ends (terminated)."""
    import mujoco

    env = rlrobot.make("mujoco-HalfCheetah-v5", 3, seed=0)
    try:
        env.reset(seed=0)
        env.datas[1].warning[mujoco.mjtWarning.mjWARN_BADQACC].number = 1  # as mj_step leaves it after a reset
        _, _, terminated, _, info = env.step(torch.zeros(3, env.action_dim))
        assert terminated.tolist() == [False, True, False]
        assert info["episode"]["env_ids"].tolist() == [1]
        assert env.datas[1].warning[mujoco.mjtWarning.mjWARN_BADQACC].number == 0
        _, _, terminated, _, _ = env.step(torch.zeros(3, env.action_dim))
        assert not terminated.any()
    finally:
        env.close()
