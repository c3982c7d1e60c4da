"""Semi-supervised offline RL (the paper on learning from action-free trajectories): keep the actions of a
share of the episodes only, train an inverse-dynamics model a = f(s, s') on them, label the other episodes with it,
and let any offline algorithm train on the union (``--labelled-fraction``).

The model is an MLP on the normalised (s, s' - s) with a tanh output (actions live in [-1, 1]), trained by mean
squared error. Transitions whose s' is not stored (an episode's last frame, whose s' is s itself) carry no motion
and are left out of its training. Which episodes keep their actions is a seeded random draw (at least one).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from rlrobot.algorithms.offline import adam, mlp
from rlrobot.data.transitions import Transitions
from rlrobot.policies.normalizer import RunningNormalizer


class InverseDynamics(nn.Module):
    def __init__(self, obs_dim: int, action_dim: int, hidden: tuple[int, ...] = (128, 128)):
        super().__init__()
        self.obs_norm = RunningNormalizer(obs_dim)
        self.delta_norm = RunningNormalizer(obs_dim)
        self.net = mlp(2 * obs_dim, hidden, action_dim)

    def fit_stats(self, s: torch.Tensor, s_next: torch.Tensor) -> None:
        self.obs_norm.update(s)
        self.delta_norm.update(s_next - s)

    def forward(self, s: torch.Tensor, s_next: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.net(torch.cat([self.obs_norm(s), self.delta_norm(s_next - s)], -1)))


def split_episodes(data: Transitions, fraction: float, seed: int) -> torch.Tensor:
    """[N] bool: the frames of the episodes that keep their actions (a seeded draw of ceil(fraction * E), >= 1)."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"labelled_fraction must be in (0, 1], got {fraction}")
    episodes = torch.unique(data.episode_index)
    count = max(1, math.ceil(fraction * len(episodes) - 1e-9))
    order = torch.randperm(len(episodes), generator=torch.Generator().manual_seed(seed))
    keep = episodes[order[:count].to(episodes.device)]
    return torch.isin(data.episode_index, keep)


def train_inverse_dynamics(s: torch.Tensor, s_next: torch.Tensor, actions: torch.Tensor, steps: int, seed: int = 0,
                           batch_size: int = 256, lr: float = 1e-3, hidden: tuple[int, ...] = (128, 128)
                           ) -> InverseDynamics:
    torch.manual_seed(seed)
    model = InverseDynamics(s.shape[1], actions.shape[1], hidden).to(s.device)
    model.fit_stats(s, s_next)
    opt = adam(model.parameters(), lr)
    gen = torch.Generator(device=s.device).manual_seed(seed)
    for _ in range(steps):
        idx = torch.randint(len(s), (min(batch_size, len(s)),), generator=gen, device=s.device)
        loss = (model(s[idx], s_next[idx]) - actions[idx]).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return model.eval()


def label_with_inverse_dynamics(data: Transitions, fraction: float, steps: int = 1000, seed: int = 0,
                                hidden: tuple[int, ...] = (128, 128)) -> Transitions:
    """The data with the actions of all but ``fraction`` of the episodes replaced by inverse-dynamics labels.

    ``info`` gets ``labelled_fraction``, ``labelled_episodes`` and ``inverse_dynamics`` (the model's mean squared
    error on the relabelled frames against the actions that were hidden: known here because the recipes' datasets
    have every action; a diagnostic, not something the algorithm sees)."""
    labelled = split_episodes(data, fraction, seed)
    s, s_next = data.obs["state"].float(), data.next_obs["state"].float()
    moving = data.episode_end != torch.arange(len(data), device=data.device)  # s' stored (not an episode's last frame)
    train = labelled & moving
    if int(train.sum()) == 0:
        raise ValueError("the labelled episodes hold no transition with a stored next observation to train the "
                         "inverse-dynamics model on; raise labelled_fraction")
    with torch.enable_grad():
        model = train_inverse_dynamics(s[train], s_next[train], data.actions[train], steps, seed, hidden=hidden)
    with torch.no_grad():
        predicted = torch.cat([model(s[i:i + 65536], s_next[i:i + 65536]) for i in range(0, len(data), 65536)])
    actions = torch.where(labelled[:, None], data.actions, predicted)
    hidden_frames = ~labelled
    error = float((predicted[hidden_frames] - data.actions[hidden_frames]).square().mean()) if hidden_frames.any() else 0.0
    out = data.with_actions(actions)
    out.info = {**data.info, "labelled_fraction": fraction,
                "labelled_episodes": int(torch.unique(data.episode_index[labelled]).numel()),
                "inverse_dynamics": {"steps": steps, "relabel_mse": error, "train_frames": int(train.sum())}}
    return out
