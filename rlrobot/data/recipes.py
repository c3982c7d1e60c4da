"""Dataset recipes for offline RL: named, reproducible kinds of data for every native task with a
scripted expert, as D4RL / D5RL make them. ``rlrobot collect --recipe NAME`` writes one; ``rlrobot datasets`` lists
the recipes and what a dataset holds.

- ``expert``: the scripted IK expert, no noise (the deterministic behaviour policy offline results are compared to).
- ``noisy-low`` / ``noisy`` / ``noisy-high``: expert actions + Gaussian noise of std 0.1 / 0.3 / 0.6 (normalised
  action space, clipped to [-1, 1]).
- ``mixed``: half the episodes noisy expert (std 0.3), half a uniformly random policy: successful and failed
  episodes side by side, where behaviour cloning copies both and offline RL has to tell them apart.
- ``play``: task-agnostic play (D5RL): each episode alternates the expert's reaching / pushing / grasping (with
  noise 0.2) and reaching toward random points in the workspace with a random gripper command, segments of 10-30
  steps; rewards are the task's own (relabelled by stepping the task).

Which behaviour drives an env is drawn per episode (a fixed-seed generator), so a recipe with a seed always writes the
same dataset on the same code and machine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Recipe:
    name: str
    summary: str
    noise: float = 0.0
    """std of the Gaussian noise added to the expert's actions"""
    random_share: float = 0.0
    """share of episodes driven by the uniformly random policy"""
    play: bool = False
    """task-agnostic play: expert segments alternate with reaching random points"""
    episodes: int = 200
    """episodes written by default"""
    seed: int = 0


RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe("expert", "scripted expert without noise (the deterministic behaviour policy)"),
    Recipe("noisy-low", "expert + Gaussian action noise, std 0.1", noise=0.1),
    Recipe("noisy", "expert + Gaussian action noise, std 0.3", noise=0.3),
    Recipe("noisy-high", "expert + Gaussian action noise, std 0.6", noise=0.6),
    Recipe("mixed", "50 % noisy expert (std 0.3), 50 % uniformly random actions", noise=0.3, random_share=0.5),
    Recipe("play", "task-agnostic play: expert segments and reaching random points, task reward relabelled",
           noise=0.2, play=True),
)}
PLAY_SEGMENT = (10, 30)
PLAY_RADIUS, PLAY_ANGLE, PLAY_HEIGHT = (0.10, 0.24), (-0.8, 0.8), (0.02, 0.14)
"""random play goals: polar around the arm's base (the reach task draws its targets from r 0.12-0.22, +-0.7 rad)"""


def recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise ValueError(f"recipe={name!r} is not a dataset recipe; recipes: {', '.join(RECIPES)}")
    return RECIPES[name]


class BehaviourPolicy:
    """The recipe's data-collection policy over a batch of envs; the behaviour of each env is drawn per episode."""

    RANDOM, EXPERT = 0, 1

    def __init__(self, rec: Recipe, num_envs: int, seed: int):
        self.recipe = rec
        self.rng = np.random.default_rng(seed)
        self.gen = torch.Generator().manual_seed(seed)
        self.mode = np.full(num_envs, self.EXPERT)
        self.segment_left = np.zeros(num_envs, np.int64)  # play: steps left in the current segment
        self.reaching = np.zeros(num_envs, bool)  # play: reaching a random point (else the expert)
        self.goal = np.zeros((num_envs, 3))
        self.grip = np.zeros(num_envs)
        self.expert_label: torch.Tensor | None = None  # the expert's noise-free action of the last act()
        self.new_episodes(np.arange(num_envs))

    def new_episodes(self, env_ids: np.ndarray) -> None:
        env_ids = np.asarray(env_ids, np.int64)
        if len(env_ids) == 0:
            return
        random = self.rng.random(len(env_ids)) < self.recipe.random_share
        self.mode[env_ids] = np.where(random, self.RANDOM, self.EXPERT)
        self.segment_left[env_ids] = 0
        self.reaching[env_ids] = self.rng.random(len(env_ids)) < 0.5

    def mode_names(self, env_ids: np.ndarray) -> list[str]:
        return ["random" if self.mode[i] == self.RANDOM else ("play" if self.recipe.play else "expert") for i in env_ids]

    def _play_actions(self, env, expert: torch.Tensor) -> torch.Tensor:
        n = env.num_envs
        switch = self.segment_left <= 0
        if switch.any():
            ids = np.nonzero(switch)[0]
            self.reaching[ids] = ~self.reaching[ids]
            self.segment_left[ids] = self.rng.integers(PLAY_SEGMENT[0], PLAY_SEGMENT[1] + 1, len(ids))
            r, a = self.rng.uniform(*PLAY_RADIUS, len(ids)), self.rng.uniform(*PLAY_ANGLE, len(ids))
            self.goal[ids] = np.stack([r * np.cos(a), r * np.sin(a), self.rng.uniform(*PLAY_HEIGHT, len(ids))], 1)
            self.grip[ids] = self.rng.uniform(-1.0, 1.0, len(ids))
        self.segment_left -= 1
        if not self.reaching.any():
            return expert
        reach = env.cartesian_action((self.goal - env.tcp) * 0.8, np.zeros(n), self.grip)
        reach = torch.as_tensor(reach, dtype=expert.dtype, device=expert.device)
        return torch.where(torch.as_tensor(self.reaching, device=expert.device)[:, None], reach, expert)

    def act(self, env) -> torch.Tensor:
        """The action each env executes; ``self.expert_label`` keeps the expert's own, noise-free one (DART labels)."""
        action = env.expert_action()
        self.expert_label = action
        if self.recipe.play:
            action = self._play_actions(env, action)
        if self.recipe.noise > 0:
            action = action + self.recipe.noise * torch.randn(action.shape, generator=self.gen).to(action.device)
        if (self.mode == self.RANDOM).any():
            uniform = torch.rand(action.shape, generator=self.gen).to(action.device) * 2.0 - 1.0
            action = torch.where(torch.as_tensor(self.mode == self.RANDOM, device=action.device)[:, None], uniform, action)
        return action.clamp(-1.0, 1.0)
