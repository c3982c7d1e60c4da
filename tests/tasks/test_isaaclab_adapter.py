"""Isaac Lab mapping on tensors shaped like Isaac Lab's (the live env needs Isaac Sim and an NVIDIA GPU)."""

import gymnasium
import numpy as np
import pytest
import torch

from rlrobot.tasks.isaaclab_adapter import (
    map_observations,
    merge_final_obs,
    observation_space,
    scale_actions,
    success_from_terms,
)

N = 4


def test_concatenated_policy_group_and_critic_group():
    groups = {"policy": torch.randn(N, 36), "critic": torch.randn(N, 48)}
    obs = map_observations(groups)
    assert set(obs) == {"state", "critic"}
    assert torch.equal(obs["state"], groups["policy"]) and obs["critic"].shape == (N, 48)


def test_term_dict_group_with_a_camera():
    groups = {"policy": {"joint_pos": torch.randn(N, 9), "object_pose": torch.randn(N, 7),
                         "wrist_cam": torch.rand(N, 32, 48, 4)}}
    obs = map_observations(groups)
    assert obs["state"].shape == (N, 16)
    assert torch.equal(obs["state"][:, :9], groups["policy"]["joint_pos"])  # term order kept
    image = obs["image_wrist_cam"]
    assert image.shape == (N, 3, 32, 48) and image.dtype == torch.uint8
    expected = (groups["policy"]["wrist_cam"][0, 5, 7, :3] * 255).round().to(torch.uint8)
    assert torch.equal(image[0, :, 5, 7], expected)


def test_observation_space_matches_mapped_observations():
    space = gymnasium.spaces.Dict({
        "policy": gymnasium.spaces.Dict({"joint_pos": gymnasium.spaces.Box(-np.inf, np.inf, (9,)),
                                         "cam": gymnasium.spaces.Box(0, 1, (24, 24, 3))}),
        "critic": gymnasium.spaces.Box(-np.inf, np.inf, (20,)),
    })
    ours = observation_space(space)
    assert ours["state"].shape == (9,) and ours["critic"].shape == (20,)
    assert ours["image_cam"].shape == (3, 24, 24) and ours["image_cam"].dtype == np.uint8


def test_missing_state_group_is_a_clear_error():
    with pytest.raises(ValueError, match="no 'policy' group"):
        map_observations({"critic": torch.zeros(N, 3)})


def test_final_obs_takes_the_terminal_observation_only_where_done():
    done = torch.tensor([True, False, False, True])
    terminal = {"state": torch.full((N, 3), 7.0)}
    next_obs = {"state": torch.zeros(N, 3)}
    final = merge_final_obs(done, terminal, next_obs)
    assert torch.equal(final["state"][done], terminal["state"][done])
    assert torch.equal(final["state"][~done], next_obs["state"][~done])


def test_success_from_termination_terms():
    terms = {"object_reached_goal": torch.tensor([True, False, False, False]),
             "lifted": torch.tensor([False, False, True, False])}
    success = success_from_terms(terms, ("object_reached_goal", "lifted"), N, torch.device("cpu"))
    assert success.tolist() == [True, False, True, False]
    assert not success_from_terms({}, (), N, torch.device("cpu")).any()
    with pytest.raises(ValueError, match="'dropped' is not a termination term"):
        success_from_terms(terms, ("dropped",), N, torch.device("cpu"))


def test_actions_are_clipped_then_scaled():
    a = torch.tensor([[-2.0, -0.5, 0.5, 3.0]])
    assert torch.equal(scale_actions(a, 0.5), torch.tensor([[-0.5, -0.25, 0.25, 0.5]]))


def test_live_isaaclab_env():
    pytest.importorskip("isaaclab", reason="Isaac Lab / Isaac Sim are not installed (they need an NVIDIA GPU and "
                                            "NVIDIA's package index); the mapping above is what runs here")
    from isaaclab.app import AppLauncher

    AppLauncher(headless=True)
    import rlrobot

    env = rlrobot.make("isaaclab:Isaac-Lift-Cube-Franka-v0", N, device="cuda:0", seed=0, max_episode_steps=5)
    obs, _ = env.reset(seed=0)
    assert obs["state"].shape == (N, *env.single_observation_space["state"].shape)
    for _ in range(5):
        obs, reward, terminated, truncated, info = env.step(torch.zeros(N, env.action_dim, device="cuda:0"))
    assert (terminated | truncated).all() and len(info["episode"]["env_ids"]) == N
    assert not torch.allclose(info["final_obs"]["state"], obs["state"])  # the true final obs, not the reset obs
    env.close()
