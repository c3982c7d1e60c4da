"""Acting with an action-chunk policy (anything with ``sample_actions``): per-env queues of planned actions, refilled
in one batched call whenever any env needs a new chunk. Evaluation, curricula's guides and deployment share it."""

from __future__ import annotations

import torch


class ChunkedActor:
    """Per-env queues of planned actions for a chunk policy, all planned in one batched call when any env needs one."""

    def __init__(self, policy, num_envs: int, execute_steps: int | None = None):
        self.policy = policy
        self.execute_steps = execute_steps or getattr(policy, "execute_steps", None) or policy.chunk_size
        self.plan: torch.Tensor | None = None
        self.position = torch.full((num_envs,), self.execute_steps, dtype=torch.long)

    @torch.no_grad()
    def act(self, obs: dict[str, torch.Tensor], deterministic: bool = True) -> torch.Tensor:
        need = self.position >= self.execute_steps
        if bool(need.any()):
            chunk = self.policy.sample_actions(obs, deterministic=deterministic)
            self.position = self.position.to(chunk.device)
            need = need.to(chunk.device)
            self.plan = chunk if self.plan is None else torch.where(need[:, None, None], chunk, self.plan)
            self.position[need] = 0
        rows = torch.arange(len(self.position), device=self.position.device)
        action = self.plan[rows, self.position]
        self.position += 1
        return action.clamp(-1.0, 1.0)

    def episode_done(self, done: torch.Tensor) -> None:
        self.position[done.to(self.position.device)] = self.execute_steps
