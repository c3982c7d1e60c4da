"""Each scripted IK expert solves its task in >= 90 % of seeded episodes, in every control mode."""

import numpy as np
import pytest

import rlrobot

EPISODES = 64


def expert_success(task: str, control_mode: str, seed: int = 0) -> float:
    env = rlrobot.make(task, 32, seed=seed, control_mode=control_mode)
    env.reset(seed=seed)
    results: list[bool] = []
    while len(results) < EPISODES:
        _, _, _, _, info = env.step(env.expert_action())
        if "episode" in info:
            results += info["episode"]["success"].tolist()
    env.close()
    return float(np.mean(results[:EPISODES]))


@pytest.mark.parametrize("task", ["so101-reach", "so101-push", "so101-lift"])
def test_expert_ee_delta(task):
    assert expert_success(task, "ee_delta") >= 0.9


@pytest.mark.parametrize("task, mode", [("so101-reach", "joint_pos"), ("so101-lift", "joint_delta"),
                                        ("so101-push", "joint_pos")])
def test_expert_joint_modes(task, mode):
    assert expert_success(task, mode) >= 0.9


def test_random_policy_rarely_succeeds():
    """The success checks are not trivially true: random actions almost never lift the cube."""
    import torch

    env = rlrobot.make("so101-lift", 32, seed=0)
    env.reset(seed=0)
    gen = torch.Generator().manual_seed(0)
    results = []
    while len(results) < EPISODES:
        _, _, _, _, info = env.step(torch.rand(32, 5, generator=gen) * 2 - 1)
        if "episode" in info:
            results += info["episode"]["success"].tolist()
    assert np.mean(results) <= 0.05
