"""Token-level PPO for an autoregressive VLA (VLA-RL, Lu et al. 2025) over pi0-FAST's action tokens.

One PPO sample is one action chunk: the policy decodes a token sequence per env (batched over envs), the FAST tokenizer
turns it into a chunk, the env executes the whole chunk (reward = the sum of its step rewards up to the first episode
end inside the chunk; a chunk in which the episode ended is ``done``, and one that ended by a time-out adds
gamma * V(final_obs), as the flow-policy runner does). Advantages are GAE over chunks with the value head on the VLM.
The loss is PPO's clipped surrogate *per token*: every token's ratio exp(log pi(a_t | prefix) - log pi_old(a_t |
prefix)) is clipped and weighted by its chunk's advantage, averaged over the real tokens (up to and including <eos>);
old log-probs come from the decoding pass, so at unchanged weights the first minibatch's ratios are 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from rlrobot.algorithms.registry import AlgorithmConfig, AlgorithmSpec, register_algorithm
from rlrobot.domains import NonNegative, Positive, PositiveInt, UnitInterval
from rlrobot.policies.vla.pi0_fast import TokenVLAPolicy


@dataclass
class TokenPPOConfig:
    rollout_chunks: PositiveInt = 4
    """chunks per env per iteration"""
    epochs: PositiveInt = 2
    num_minibatches: PositiveInt = 2
    learning_rate: Positive = 1e-4
    value_learning_rate: Positive = 1e-3
    clip: Positive = 0.2
    value_coef: NonNegative = 0.5
    entropy_coef: NonNegative = 0.0
    max_grad_norm: Positive = 1.0
    gamma: UnitInterval = 0.99
    """discount per chunk"""
    gae_lambda: UnitInterval = 0.95

    def validate(self) -> None:
        for name in ("rollout_chunks", "epochs", "num_minibatches"):
            if getattr(self, name) < 1:
                raise ValueError(f"token_ppo.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("learning_rate", "value_learning_rate", "clip", "max_grad_norm"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"token_ppo.{name} must be a finite number > 0, got {value}")
        for name in ("gamma", "gae_lambda"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"token_ppo.{name} must be in [0, 1], got {getattr(self, name)}")


def collect(env, policy: TokenVLAPolicy, obs: dict[str, torch.Tensor], cfg: TokenPPOConfig,
            generator: torch.Generator | None = None, on_info=None) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """``cfg.rollout_chunks`` chunks from every env: (batch with obs / tokens / mask / old log-probs / advantages /
    returns, each [N = chunks * envs, ...], the next observation)."""
    keys = ("state",) + (("image_front",) if "image_front" in obs else ())
    steps: list[dict[str, Any]] = []
    for _ in range(cfg.rollout_chunks):
        current = {k: obs[k] for k in keys}
        tokens, logp, mask = policy.sample(current, generator=generator)
        with torch.no_grad():
            value = policy.value(current)
        chunk = policy.actions(tokens, mask).clamp(-1.0, 1.0)
        reward = torch.zeros(len(tokens))
        done = torch.zeros(len(tokens), dtype=torch.bool)
        for h in range(chunk.shape[1]):
            obs, r, terminated, truncated, info = env.step(chunk[:, h])
            if on_info is not None:  # the runner's episode tracking (returns, success)
                on_info(info)
            reward += torch.where(done, torch.zeros_like(r), r.float())  # steps of a new episode are not credited
            timeout = truncated.bool() & ~done
            if timeout.any():  # a time-out is not a terminal: bootstrap it with the value of the true final observation
                with torch.no_grad():
                    final_value = policy.value({k: info["final_obs"][k] for k in keys})
                reward += cfg.gamma * final_value * timeout
            done |= terminated.bool() | truncated.bool()
        steps.append({"obs": current, "tokens": tokens, "logp": logp, "mask": mask, "value": value, "reward": reward,
                      "done": done})
    with torch.no_grad():
        next_value = policy.value({k: obs[k] for k in keys})
    advantages, last = [], torch.zeros_like(next_value)
    for i in reversed(range(len(steps))):
        s = steps[i]
        following = next_value if i == len(steps) - 1 else steps[i + 1]["value"]
        nonterminal = (~s["done"]).float()
        delta = s["reward"] + cfg.gamma * following * nonterminal - s["value"]
        last = delta + cfg.gamma * cfg.gae_lambda * nonterminal * last
        advantages.insert(0, last)
    adv = torch.cat(advantages)
    batch = {"obs": {k: torch.cat([s["obs"][k] for s in steps]) for k in keys},
             **{k: torch.cat([s[k] for s in steps]) for k in ("tokens", "logp", "mask", "value", "reward")},
             "advantages": adv}
    batch["returns"] = adv + batch["value"]
    return batch, obs


class TokenPPO:
    def __init__(self, policy: TokenVLAPolicy, cfg: TokenPPOConfig):
        cfg.validate()
        self.policy, self.cfg = policy, cfg
        self.optimizer = torch.optim.Adam([
            {"params": policy.policy_parameters(), "lr": cfg.learning_rate},
            {"params": list(policy.value_head.parameters()), "lr": cfg.value_learning_rate}])

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])

    def update(self, batch: dict[str, Any], generator: torch.Generator | None = None) -> dict[str, float]:
        """PPO epochs over the batch; returns the losses and the first minibatch's max |ratio - 1|."""
        cfg, n = self.cfg, len(batch["tokens"])
        adv = batch["advantages"]
        adv = (adv - adv.mean()) / (adv.std() + 1e-8) if n > 1 else adv
        size = max(1, n // cfg.num_minibatches)
        stats: dict[str, float] = {}
        first = True
        for _ in range(cfg.epochs):
            order = torch.randperm(n, generator=generator)
            for start in range(0, n - size + 1, size):
                idx = order[start:start + size]
                obs = {k: v[idx] for k, v in batch["obs"].items()}
                mask = batch["mask"][idx]
                logp, entropy, value = self.policy.token_log_probs(obs, batch["tokens"][idx], mask)
                ratio = torch.exp(logp - batch["logp"][idx])
                a = adv[idx][:, None]
                surrogate = torch.minimum(ratio * a, ratio.clamp(1 - cfg.clip, 1 + cfg.clip) * a)
                tokens = mask.sum().clamp_min(1.0)
                policy_loss = -(surrogate * mask).sum() / tokens
                entropy_mean = entropy.sum() / tokens
                value_loss = (value - batch["returns"][idx]).square().mean()
                loss = policy_loss + cfg.value_coef * value_loss - cfg.entropy_coef * entropy_mean
                self.optimizer.zero_grad()
                loss.backward()
                for group in self.optimizer.param_groups:  # apart: the value loss's large gradients would
                    torch.nn.utils.clip_grad_norm_(group["params"], cfg.max_grad_norm)  # shrink the policy's step
                self.optimizer.step()
                if first:
                    stats["first_ratio_max_dev"] = float(((ratio.detach() - 1).abs() * mask).max())
                    first = False
                stats.update(policy_loss=policy_loss.item(), value_loss=value_loss.item(), entropy=entropy_mean.item(),
                             clip_frac=float((((ratio - 1).abs() > cfg.clip).float() * mask).sum() / tokens))
        return stats


@dataclass
class VLATokenPPOConfig(TokenPPOConfig, AlgorithmConfig):
    def validate(self, run=None) -> None:
        TokenPPOConfig.validate(self)
        if run is not None and (run.num_envs * self.rollout_chunks) % self.num_minibatches:
            raise ValueError(f"num_envs x token_ppo.rollout_chunks = {run.num_envs * self.rollout_chunks} must be divisible "
                             f"by token_ppo.num_minibatches={self.num_minibatches}")

    def env_steps_per_iteration(self, run) -> int:
        try:
            chunk = run.vla_fast.chunk_size()
        except (ValueError, OSError, KeyError):
            chunk = 1  # a bad path is reported by prepare()
        return run.num_envs * self.rollout_chunks * chunk

    def prepare(self, run) -> None:
        run.vla_fast.validate()
        run.vla_fast.chunk_size()  # the directory is a pi0-FAST one, before anything is built


register_algorithm(AlgorithmSpec(
    name="vla-token-ppo", summary="token-level PPO (VLA-RL) of a LeRobot pi0-FAST from --vla-fast.path",
    config_field="token_ppo", config=VLATokenPPOConfig, policy_kind="vla-fast",
    runner="rlrobot.runners.token_ppo:TokenPPORunner"))
