"""The inverse-dynamics labeller (rlrobot.algorithms.inverse_dynamics): episodes without actions labelled from the
motion the others show."""

import torch

from rlrobot.algorithms.inverse_dynamics import label_with_inverse_dynamics, split_episodes
from rlrobot.data.transitions import synthetic_transitions


def test_inverse_dynamics_labels_the_episodes_that_lost_their_actions():
    data = synthetic_transitions((10,) * 40, obs_dim=4, action_dim=2, seed=2)  # s' = s + 0.1 [a, 0, 0]
    keep = split_episodes(data, 0.25, seed=0)
    assert torch.unique(data.episode_index[keep]).numel() == 10  # ceil(25 % of 40 episodes)
    out = label_with_inverse_dynamics(data, 0.25, steps=300, seed=0, hidden=(32, 32))
    assert torch.equal(out.actions[keep], data.actions[keep])  # the labelled episodes keep their actions
    relabelled = ~keep & (data.episode_end != torch.arange(len(data)))  # s' stored: the motion shows the action
    error = (out.actions[relabelled] - data.actions[relabelled]).abs().mean().item()
    assert error < 0.2 < 0.6 < data.actions[relabelled].abs().mean().item()  # measured 0.11 vs 0.63
    assert out.info["labelled_episodes"] == 10 and out.info["inverse_dynamics"]["train_frames"] == 90
    assert torch.equal(out.rewards, data.rewards) and torch.equal(out.terminals, data.terminals)
