"""The evaluation protocol: a fixed set of episodes whose membership does not depend on how fast they end."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
import torch

from rlrobot.results.experts import expert_rates
from rlrobot.runners.evaluation import EpisodeSlots, evaluate


class EarlyFailureEnv:
    """A VecEnv whose episodes succeed with probability ``p`` and then last ``max_episode_steps`` steps, while failures
    end (terminate) uniformly in [10, max_episode_steps - 1]: the shape of a task with a fall or a lost cube."""

    def __init__(self, num_envs: int = 32, p: float = 0.5, max_episode_steps: int = 100):
        self.num_envs, self.p, self.max_episode_steps = num_envs, p, max_episode_steps
        self.device = torch.device("cpu")
        self.single_observation_space = gymnasium.spaces.Dict({"state": gymnasium.spaces.Box(-1, 1, (1,))})
        self.single_action_space = gymnasium.spaces.Box(-1, 1, (1,))
        self.rng = np.random.default_rng(0)

    def _draw(self, ids: np.ndarray) -> None:
        self.will_succeed[ids] = self.rng.random(len(ids)) < self.p
        self.end[ids] = np.where(self.will_succeed[ids], self.max_episode_steps,
                                 self.rng.integers(10, self.max_episode_steps, len(ids)))
        self.t[ids] = 0

    def reset(self, seed: int | None = None):
        self.rng = np.random.default_rng(seed)
        self.will_succeed = np.zeros(self.num_envs, dtype=bool)
        self.end = np.zeros(self.num_envs, dtype=np.int64)
        self.t = np.zeros(self.num_envs, dtype=np.int64)
        self._draw(np.arange(self.num_envs))
        return self._obs(), {}

    def _obs(self):
        return {"state": torch.zeros(self.num_envs, 1)}

    def expert_action(self) -> torch.Tensor:
        return torch.zeros(self.num_envs, 1)

    def step(self, action: torch.Tensor):
        self.t += 1
        ended = self.t >= self.end
        terminated = torch.as_tensor(ended & ~self.will_succeed)
        truncated = torch.as_tensor(ended & self.will_succeed)
        info: dict = {"final_obs": self._obs(), "success": torch.as_tensor(ended & self.will_succeed)}
        ids = np.flatnonzero(ended)
        if len(ids):
            info["episode"] = {"env_ids": torch.as_tensor(ids), "return": torch.as_tensor(self.will_succeed[ids], dtype=torch.float32),
                               "length": torch.as_tensor(self.t[ids]), "success": torch.as_tensor(self.will_succeed[ids])}
            self._draw(ids)
        return self._obs(), torch.zeros(self.num_envs), terminated, truncated, info

    def close(self) -> None:
        pass


class ZeroPolicy:
    def act(self, obs, deterministic: bool = True) -> torch.Tensor:
        return torch.zeros(len(obs["state"]), 1)


@pytest.mark.parametrize("p", [0.5, 0.3])
def test_evaluation_reports_the_true_success_rate_when_failures_end_early(p):
    # 32 envs, 64 episodes: "the first 64 to finish" reports a true 0.5 as ~0.41 and 0.3 as ~0.23
    env = EarlyFailureEnv(num_envs=32, p=p)
    rates = [evaluate(ZeroPolicy(), env, episodes=64, seed=seed)["success_rate"] for seed in range(150)]
    standard_error = np.sqrt(p * (1 - p) / (64 * len(rates)))
    assert abs(np.mean(rates) - p) < 3.5 * standard_error


def test_evaluation_counts_each_envs_quota_of_whole_episodes():
    env = EarlyFailureEnv(num_envs=4, p=0.5)
    result = evaluate(ZeroPolicy(), env, episodes=10, seed=3)
    assert result["episodes"] == 10
    slots = EpisodeSlots(10, 4)
    assert slots.assign(torch.tensor([1, 3])).tolist() == [1, 3]
    assert slots.assign(torch.tensor([1])).tolist() == [5]
    assert slots.assign(torch.tensor([1])).tolist() == [9]
    assert slots.assign(torch.tensor([1, 0])).tolist() == [-1, 0]  # env 1 has run its quota of 3; env 0 its first
    assert slots.assign(torch.tensor([3, 2])).tolist() == [7, 2]
    assert not slots.complete
    slots.assign(torch.tensor([0, 2])), slots.assign(torch.tensor([0, 2, 3]))
    assert slots.complete and slots.filled == 10


def test_evaluation_is_reproducible_and_leaves_the_training_rng_alone():
    class NoisyPolicy:
        def act(self, obs, deterministic: bool = True) -> torch.Tensor:
            return torch.randn(len(obs["state"]), 1)

    class NoisyEnv(EarlyFailureEnv):
        def step(self, action):  # success decided by the policy's own random draws
            self.will_succeed |= (action[:, 0] > 2.0).numpy() & (self.t == 0)
            return super().step(action)

    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    first = evaluate(NoisyPolicy(), NoisyEnv(num_envs=8, p=0.0), episodes=32, seed=5)
    assert torch.equal(torch.random.get_rng_state(), before)
    second = evaluate(NoisyPolicy(), NoisyEnv(num_envs=8, p=0.0), episodes=32, seed=5)
    assert first == second


def test_expert_rates_count_a_fixed_set_of_episodes(monkeypatch):
    import rlrobot

    p = 0.5
    monkeypatch.setattr(rlrobot, "make", lambda task, num_envs, **kw: EarlyFailureEnv(num_envs=num_envs, p=p))
    rates = [expert_rates("so101-push", episodes=64, seed=seed, num_envs=32)["success"] for seed in range(100)]
    assert abs(np.mean(rates) - p) < 3.5 * np.sqrt(p * (1 - p) / (64 * len(rates)))
