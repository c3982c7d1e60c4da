"""Token PPO's chunk returns: a time-out is bootstrapped from the final observation, a terminal is not."""

from __future__ import annotations

import pytest
import torch

from rlrobot.algorithms.token_ppo import TokenPPOConfig, collect


class TwoStateChain:
    """One env alternating between state 0 (reward 1) and state 1 (reward 0); the episode ends after ``limit`` steps,
    by a time-out (truncated) or, with ``terminal=True``, by a terminal state."""

    def __init__(self, limit: int = 4, terminal: bool = False):
        self.num_envs, self.limit, self.terminal = 1, limit, terminal
        self.t, self.s = 0, 0

    def obs(self) -> dict[str, torch.Tensor]:
        return {"state": torch.tensor([[float(self.s)]])}

    def step(self, action):
        reward = torch.tensor([1.0 if self.s == 0 else 0.0])
        self.t, self.s = self.t + 1, 1 - self.s
        ended = self.t >= self.limit
        final = self.obs()
        if ended:
            self.t, self.s = 0, 0
        flag, no = torch.tensor([ended]), torch.tensor([False])
        terminated, truncated = (flag, no) if self.terminal else (no, flag)
        return self.obs(), reward, terminated, truncated, {"final_obs": final}


class FixedValuePolicy:
    """V(s) = 3 + 2 s; one token per chunk; the chunk's actions do not matter to the chain."""

    def __init__(self, horizon: int):
        self.horizon = horizon

    def value(self, obs):
        return 3.0 + 2.0 * obs["state"][:, 0]

    def sample(self, obs, generator=None):
        n = len(obs["state"])
        return torch.zeros(n, 1, dtype=torch.long), torch.zeros(n, 1), torch.ones(n, 1)

    def actions(self, tokens, mask):
        return torch.zeros(len(tokens), self.horizon, 1)


@pytest.mark.parametrize("terminal", [False, True])
def test_token_ppo_value_targets_bootstrap_time_outs_but_not_terminals(terminal):
    gamma, lam = 0.9, 0.95
    env = TwoStateChain(limit=4, terminal=terminal)
    cfg = TokenPPOConfig(rollout_chunks=2, gamma=gamma, gae_lambda=lam)
    batch, _ = collect(env, FixedValuePolicy(horizon=2), env.obs(), cfg)
    # by hand: both chunks start in state 0 (V = 3) and earn 1 + 0; the episode ends after chunk 2 in state 0,
    # whose value 3 is bootstrapped when the end is a time-out
    v1 = v2 = 3.0
    r1 = 1.0
    r2 = 1.0 + (0.0 if terminal else gamma * 3.0)
    adv2 = r2 - v2  # done: no next value
    adv1 = r1 + gamma * v2 - v1 + gamma * lam * adv2
    assert batch["reward"].tolist() == pytest.approx([r1, r2])
    assert batch["returns"].tolist() == pytest.approx([adv1 + v1, adv2 + v2])
