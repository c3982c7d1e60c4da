"""Tiny hand-made offline datasets for the FQL / RQL tests (built with the loader's ``from_arrays``)."""

from __future__ import annotations

import numpy as np
import torch

from rlrobot.data.transitions import Transitions, from_arrays

BEST_GAIN = 0.6
"""the bandit's best action is BEST_GAIN * s"""


def bandit_transitions(n: int, seed: int = 0, terminal: bool = True) -> Transitions:
    """One-step episodes: s ~ U[-1, 1]^2, uniform random actions a ~ U[-1, 1]^2, r = -|a - 0.6 s|^2. Behaviour cloning
    acts near the data's mean (0); the best action is 0.6 s. ``terminal=False``: each episode times out instead."""
    rng = np.random.default_rng(seed)
    s = rng.uniform(-1, 1, size=(n, 2)).astype(np.float32)
    a = rng.uniform(-1, 1, size=(n, 2)).astype(np.float32)
    r = -np.square(a - BEST_GAIN * s).sum(1)
    ends = np.ones(n, bool)
    return from_arrays(s, a, r, np.arange(n), ends & terminal, ends & (not terminal), np.zeros(n, bool), gamma=0.99)


def chain_transitions(episode_rewards: list[list[float]], terminated: list[bool], gamma: float) -> Transitions:
    """Episodes with the given rewards; the state is the flat frame index (so a test can see which frame a window
    starts at and bootstraps from); each episode ends terminated or timed out as given."""
    rewards = np.concatenate([np.asarray(r, np.float32) for r in episode_rewards])
    episode = np.concatenate([np.full(len(r), e) for e, r in enumerate(episode_rewards)])
    n = len(rewards)
    last = np.ones(n, bool)
    last[:-1] = episode[1:] != episode[:-1]
    term = last & np.asarray(terminated)[episode]
    return from_arrays(np.arange(n, dtype=np.float32)[:, None], np.zeros((n, 1), np.float32), rewards, episode, term,
                       last & ~term, np.zeros(n, bool), gamma=gamma)


def mean_distance_to_best(actions: torch.Tensor, states: torch.Tensor) -> float:
    """Mean Euclidean distance of the actions from the bandit's best action 0.6 s."""
    return float((actions - BEST_GAIN * states).norm(dim=1).mean())
