"""Replay buffer for off-policy learning: preallocated tensors on the device, one row per vector-env step.

Layout ``[rows, num_envs, ...]``: row ``t`` holds the transition every env made at the ``t``-th stored step, so an
env's own timeline is a column and n-step returns are a gather along it at sample time (no per-env Python loops).

``next_obs`` of a transition that ended its episode (terminated *or* truncated) is the episode's true final
observation, ``info["final_obs"]`` of the VecEnv contract, never the first observation of the next episode that
same-step autoreset returns. Only ``terminated`` stops bootstrapping; a truncation (time-out) is bootstrapped from
the final observation. Both end the accumulation of an n-step return.

``add(..., keep=mask)`` stores only the envs whose ``keep`` is True (JSRL: the learner's own steps, never a guide's).
Each env column therefore has its own write position and fill (``pos``, ``count``); an env's kept transitions stay
contiguous in its column, so n-step windows still follow its own timeline (a skipped stretch is always the start of an
episode, after the previous episode's done, which ends any window). Sampling is uniform over every stored transition.
"""

from __future__ import annotations

from typing import Any

import torch

Obs = dict[str, torch.Tensor]


class ReplayBuffer:
    def __init__(
        self,
        capacity: int,
        num_envs: int,
        obs_shapes: dict[str, tuple[int, ...]],
        action_dim: int,
        device: torch.device | str = "cpu",
        obs_dtypes: dict[str, torch.dtype] | None = None,
        n_step: int = 1,
        gamma: float = 0.99,
    ):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if capacity < num_envs:
            raise ValueError(f"replay capacity={capacity} is smaller than num_envs={num_envs}: one vector step "
                             "(num_envs transitions) must fit; raise the buffer size")
        if n_step < 1:
            raise ValueError(f"n_step must be >= 1, got {n_step}")
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {gamma}")
        self.num_envs, self.n_step, self.gamma = num_envs, n_step, gamma
        self.rows = capacity // num_envs
        if self.rows < n_step:
            raise ValueError(f"replay capacity={capacity} holds {self.rows} steps per env, fewer than n_step={n_step}")
        self.capacity = self.rows * num_envs
        self.device = torch.device(device)
        dtypes = obs_dtypes or {}
        # images come as uint8 and stay uint8 here (4x less memory); the networks convert on the fly
        self.obs = {k: torch.zeros(self.rows, num_envs, *s, dtype=dtypes.get(k, torch.float32), device=self.device)
                    for k, s in obs_shapes.items()}
        self.next_obs = {k: torch.zeros_like(v) for k, v in self.obs.items()}
        self.actions = torch.zeros(self.rows, num_envs, action_dim, device=self.device)
        self.rewards = torch.zeros(self.rows, num_envs, device=self.device)
        self.terminated = torch.zeros(self.rows, num_envs, dtype=torch.bool, device=self.device)
        self.truncated = torch.zeros(self.rows, num_envs, dtype=torch.bool, device=self.device)
        self.pos = torch.zeros(num_envs, dtype=torch.long, device=self.device)  # next row to write, per env
        self.count = torch.zeros(num_envs, dtype=torch.long, device=self.device)  # filled rows, per env (<= rows)

    @property
    def row(self) -> int:
        """The next row to write (of env 0; every env's when nothing was skipped)."""
        return int(self.pos[0])

    @property
    def full(self) -> bool:
        return bool((self.count == self.rows).all())

    def __len__(self) -> int:
        return int(self.count.sum())

    def _samplable_per_env(self) -> torch.Tensor:
        """The newest n-1 transitions of each env wait until their n-step future is stored."""
        return (self.count - (self.n_step - 1)).clamp(min=0)

    @property
    def num_samplable(self) -> int:
        """Transitions that can be drawn now."""
        return int(self._samplable_per_env().sum())

    def add(self, obs: Obs, action: torch.Tensor, reward: torch.Tensor, terminated: torch.Tensor,
            truncated: torch.Tensor, next_obs: Obs, final_obs: Obs | None = None, keep: torch.Tensor | None = None) -> None:
        """Store one vector step. Where an env is done, ``final_obs`` (``info["final_obs"]``) replaces ``next_obs``.
        ``keep`` (bool [num_envs]): store only these envs' transitions (None: all)."""
        done = (terminated | truncated).to(self.device)
        if keep is None and bool((self.pos == self.pos[0]).all()):  # the common case: one row for every env
            t = int(self.pos[0])
            for k, buf in self.obs.items():
                buf[t].copy_(obs[k])
                nxt = next_obs[k]
                if final_obs is not None:
                    nxt = torch.where(done.view(-1, *([1] * (nxt.dim() - 1))), final_obs[k], nxt)
                self.next_obs[k][t].copy_(nxt)
            self.actions[t].copy_(action)
            self.rewards[t].copy_(reward)
            self.terminated[t].copy_(terminated)
            self.truncated[t].copy_(truncated)
            self.pos.fill_((t + 1) % self.rows)
            self.count.add_(1).clamp_(max=self.rows)
            return
        keep = torch.ones(self.num_envs, dtype=torch.bool, device=self.device) if keep is None \
            else keep.to(self.device, torch.bool)
        envs = keep.nonzero().flatten()
        rows = self.pos[envs]
        for k, buf in self.obs.items():
            nxt = next_obs[k]
            if final_obs is not None:
                nxt = torch.where(done.view(-1, *([1] * (nxt.dim() - 1))), final_obs[k], nxt)
            buf[rows, envs] = obs[k].to(self.device)[envs].to(buf.dtype)
            self.next_obs[k][rows, envs] = nxt.to(self.device)[envs].to(buf.dtype)
        self.actions[rows, envs] = action.to(self.device)[envs].to(self.actions.dtype)
        self.rewards[rows, envs] = reward.to(self.device)[envs].to(self.rewards.dtype)
        self.terminated[rows, envs] = terminated.to(self.device)[envs]
        self.truncated[rows, envs] = truncated.to(self.device)[envs]
        self.pos[envs] = (rows + 1) % self.rows
        self.count[envs] = (self.count[envs] + 1).clamp(max=self.rows)

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> dict[str, Any]:
        """Uniform sample with n-step returns. ``discount`` is gamma^m (m <= n steps taken), zero past a termination."""
        if batch_size > self.num_samplable:
            raise ValueError(f"batch_size={batch_size} is larger than the {self.num_samplable} transitions the replay "
                             "buffer can sample now")
        per_env = self._samplable_per_env()
        ends = per_env.cumsum(0)
        i = torch.randint(0, int(ends[-1]), (batch_size,), device=self.device, generator=generator)
        env = torch.searchsorted(ends, i, right=True)  # the env column of the i-th samplable transition
        j = i - (ends[env] - per_env[env])  # its index within the column, oldest first
        start = torch.where(self.count == self.rows, self.pos, torch.zeros_like(self.pos))  # each column's oldest row
        t = (start[env] + j) % self.rows
        if self.n_step == 1:
            last, reward = t, self.rewards[t, env]
            steps = torch.ones(batch_size, device=self.device)
        else:
            ks = torch.arange(self.n_step, device=self.device)
            tk = (t[:, None] + ks) % self.rows  # [B, n] along each env's own timeline
            ended = (self.terminated | self.truncated)[tk, env[:, None]].float()
            # alive[k] = 1 while no earlier step of the window ended its episode
            alive = torch.cumprod(torch.cat([torch.ones_like(ended[:, :1]), 1.0 - ended[:, :-1]], 1), 1)
            reward = (self.rewards[tk, env[:, None]] * alive * self.gamma ** ks).sum(1)
            steps = alive.sum(1)
            last = (t + steps.long() - 1) % self.rows
        terminated = self.terminated[last, env]
        return {
            "obs": {k: v[t, env] for k, v in self.obs.items()},
            "actions": self.actions[t, env],
            "rewards": reward,
            "next_obs": {k: v[last, env] for k, v in self.next_obs.items()},
            "terminated": terminated,
            "discount": (self.gamma ** steps) * (~terminated).float(),
        }

    # ------------------------------------------------------------------ checkpointing (--save-replay)
    def state_dict(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Tensors (only the filled rows) and metadata, for ``replay.safetensors`` beside a checkpoint."""
        filled = int(self.count.max())
        tensors = {f"obs.{k}": v[:filled] for k, v in self.obs.items()}
        tensors.update({f"next_obs.{k}": v[:filled] for k, v in self.next_obs.items()})
        tensors.update(actions=self.actions[:filled], rewards=self.rewards[:filled],
                       terminated=self.terminated[:filled], truncated=self.truncated[:filled],
                       pos=self.pos.clone(), count=self.count.clone())
        return tensors, {"row": self.row, "full": self.full, "rows": self.rows, "num_envs": self.num_envs}

    def load_state_dict(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        if meta["rows"] != self.rows or meta["num_envs"] != self.num_envs:
            raise ValueError(f"saved replay has {meta['rows']} rows x {meta['num_envs']} envs; this buffer has "
                             f"{self.rows} x {self.num_envs} (buffer size and num_envs must match to restore it)")
        filled = tensors["actions"].shape[0]
        for k, v in self.obs.items():
            v[:filled].copy_(tensors[f"obs.{k}"])
            self.next_obs[k][:filled].copy_(tensors[f"next_obs.{k}"])
        for name in ("actions", "rewards", "terminated", "truncated"):
            getattr(self, name)[:filled].copy_(tensors[name])
        if "pos" in tensors:
            self.pos.copy_(tensors["pos"])
            self.count.copy_(tensors["count"])
        else:  # saved before per-env positions: every env at the same row
            self.pos.fill_(meta["row"])
            self.count.fill_(self.rows if meta["full"] else meta["row"])
