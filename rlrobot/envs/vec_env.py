"""The VecEnv contract every simulator, adapter and robot speaks: batched tensors, same-step autoreset
(info["final_obs"], info["episode"])."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import gymnasium
import torch

Obs = dict[str, torch.Tensor]
POLICY_ACTED = "policy_acted"
"""optional info key: bool [num_envs], False where a wrapper replaced the policy's action at this step (a curriculum's
guide, an intervention); learners train on the steps their policy chose only"""
CURRICULUM = "curriculum"
"""optional info key: {name: float} of a training-env curriculum's state (the runners log the latest)"""


@runtime_checkable
class VecEnv(Protocol):
    """Batched, tensor-first environment with same-step autoreset.

    ``step`` returns ``(obs, reward, terminated, truncated, info)`` with tensors of shape ``[num_envs, ...]`` on
    ``device``. An env that finishes is reset inside ``step``: ``obs`` is the new episode's first observation,
    ``info["final_obs"]`` the last observation of the finished one, ``info["episode"]`` the statistics of the
    episodes that finished in this step. Training-env wrappers may add ``info[POLICY_ACTED]`` and
    ``info[CURRICULUM]``.
    """

    num_envs: int
    device: torch.device
    single_observation_space: gymnasium.spaces.Dict
    single_action_space: gymnasium.spaces.Box
    max_episode_steps: int

    def reset(self, seed: int | None = None) -> tuple[Obs, dict[str, Any]]: ...

    def step(self, action: torch.Tensor) -> tuple[Obs, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]: ...

    def close(self) -> None: ...


def check_action(action: Any, num_envs: int, action_dim: int, device: torch.device) -> torch.Tensor:
    """Validate an action batch before it reaches a simulator; raise a clear error otherwise."""
    if not isinstance(action, torch.Tensor):
        raise TypeError(f"action must be a torch.Tensor of shape [{num_envs}, {action_dim}], got {type(action).__name__}")
    if tuple(action.shape) != (num_envs, action_dim):
        raise ValueError(f"action has shape {tuple(action.shape)}, expected [num_envs={num_envs}, action_dim={action_dim}]")
    if not action.dtype.is_floating_point:
        raise TypeError(f"action dtype must be floating point (float32 expected), got {action.dtype}")
    if action.device != device:
        raise ValueError(f"action is on device {action.device}, the env runs on {device}")
    if not bool(torch.isfinite(action).all()):
        bad = (~torch.isfinite(action)).any(dim=-1).nonzero().flatten().tolist()
        raise ValueError(f"action contains NaN or Inf (env indices {bad[:10]})")
    return action


def episode_info(
    done: torch.Tensor, returns: torch.Tensor, lengths: torch.Tensor, success: torch.Tensor, success_once: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Statistics of the episodes that finished this step (one entry per finished env)."""
    ids = done.nonzero().flatten()
    return {
        "env_ids": ids,
        "return": returns[ids].clone(),
        "length": lengths[ids].clone(),
        "success": success[ids].clone(),
        "success_once": success_once[ids].clone(),
    }


class EpisodeTracker:
    """Return, length and success-once per env, for adapters whose simulator does not report finished episodes in
    our form; ``step`` returns ``info["episode"]`` for the envs that finished (None when none did)."""

    def __init__(self, num_envs: int):
        self.returns = torch.zeros(num_envs)
        self.lengths = torch.zeros(num_envs, dtype=torch.long)
        self.success_once = torch.zeros(num_envs, dtype=torch.bool)

    def reset(self) -> None:
        self.returns.zero_()
        self.lengths.zero_()
        self.success_once.zero_()

    def step(self, reward: torch.Tensor, success: torch.Tensor, done: torch.Tensor,
             device: torch.device) -> dict[str, torch.Tensor] | None:
        reward, success, done = reward.cpu(), success.cpu(), done.cpu()
        self.returns += reward
        self.lengths += 1
        self.success_once |= success
        if not bool(done.any()):
            return None
        episode = {k: v.to(device) for k, v in
                   episode_info(done, self.returns, self.lengths, success, self.success_once).items()}
        self.returns[done] = 0.0
        self.lengths[done] = 0
        self.success_once[done] = False
        return episode
