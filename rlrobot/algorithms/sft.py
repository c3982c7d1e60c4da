"""Supervised fine-tuning of a flow policy on demonstrations by flow matching (pi0's recipe).

Loss: || v_theta(x_t, t, obs) - (eps - a) ||^2 over action chunks, x_t = t * eps + (1 - t) * a, with t drawn from
pi0's Beta(1.5, 1) skewed to high noise (or uniform), masked where a chunk runs past the end of its episode.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch

from rlrobot.algorithms.registry import AlgorithmConfig, AlgorithmSpec, register_algorithm
from rlrobot.data.demonstrations import Demonstrations
from rlrobot.data.transitions import scaled_budget
from rlrobot.domains import NonNegative, NonNegativeInt, Positive, PositiveInt
from rlrobot.policies.flow import FlowPolicy

TIME_SAMPLING = ("beta", "uniform")


@dataclass
class DatasetInput:
    dataset: str = ""
    """LeRobotDataset directory (e.g. written by `rlrobot collect`, or any dataset with matching features)"""


def adopt_scaled_budget(run, batch_size: int) -> int:
    """The budget of a run whose task has no preset for its algorithm, scaled to its dataset, said in one line."""
    steps, frames = scaled_budget(run.dataset, batch_size)
    print(f"{run.algo}: no preset budget for task {run.task!r}: {steps:,} gradient steps, scaled to the dataset "
          f"({frames:,} frames, batches of {batch_size}); {run.spec.budget_flag()} sets it", flush=True)
    return steps


@dataclass
class SFTConfig(AlgorithmConfig):
    budget_field: ClassVar[str | None] = "num_updates"
    num_updates: PositiveInt | None = None
    """gradient steps; None: the task's preset's, or where the task has none, scaled to the dataset (50 passes, 2,000
    to 100,000)"""
    batch_size: PositiveInt = 256
    """chunks per gradient update"""
    lr: Positive = 3e-4
    """peak learning rate (AdamW)"""
    weight_decay: NonNegative = 1e-4
    """AdamW weight decay"""
    warmup_updates: NonNegativeInt = 200
    """linear warm-up before the cosine decay"""
    max_grad_norm: Positive = 1.0
    """global gradient-norm clip"""
    time_sampling: Literal["beta", "uniform"] = "beta"
    """beta (pi0: Beta(1.5, 1), skewed to high noise) | uniform"""
    updates_per_iteration: PositiveInt = 100
    """gradient steps between log lines (one runner iteration)"""
    max_episodes: NonNegativeInt = 0
    """use only the first N episodes of the dataset (0 = all)"""

    def validate(self, run) -> None:
        for name in ("batch_size", "updates_per_iteration"):
            if getattr(self, name) < 1:
                raise ValueError(f"sft.{name} must be >= 1, got {getattr(self, name)}")
        if not run.dataset:
            raise ValueError(f"algo={run.algo!r} needs --dataset DIR (a LeRobotDataset, e.g. from `rlrobot collect`)")
        if self.time_sampling not in TIME_SAMPLING:
            raise ValueError(f"sft.time_sampling={self.time_sampling!r} is not one of {TIME_SAMPLING}")
        if self.lr <= 0:
            raise ValueError(f"sft.lr must be > 0, got {self.lr}")

    def env_steps_per_iteration(self, run) -> int:
        return 0  # learns from the dataset; the env is only evaluated

    @property
    def discount(self) -> None:
        return None

    def prepare(self, run) -> None:
        if not (Path(run.dataset) / "meta" / "info.json").is_file():
            raise FileNotFoundError(f"dataset={run.dataset!r} is not a LeRobotDataset (no meta/info.json)")
        if self.num_updates is None:
            self.num_updates = adopt_scaled_budget(run, self.batch_size)


def sample_time(batch: int, how: str, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    u = torch.rand(batch, generator=generator, device=device)
    if how == "uniform":
        return u * 0.999 + 0.001
    # Beta(1.5, 1) by inversion: its CDF is x^1.5, so x = u^(1/1.5)
    return u.pow(1.0 / 1.5) * 0.999 + 0.001


class FlowSFT:
    def __init__(self, policy: FlowPolicy, demos: Demonstrations, cfg: SFTConfig, device: torch.device, sync=None):
        self.policy, self.demos, self.cfg, self.device = policy, demos, cfg, device
        self.sync = sync  # data-parallel: each rank draws its own minibatches, gradients are averaged
        self.obs = {k: v.to(device) for k, v in demos.obs.items()}
        self.chunks = demos.chunks.to(device)
        self.mask = demos.mask.to(device)
        self.optimizer = torch.optim.AdamW(list(policy.flow_matching_parameters()), lr=cfg.lr,
                                           weight_decay=cfg.weight_decay)
        self.updates = 0

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = state["updates"]

    def lr_at(self, update: int) -> float:
        """Linear warm-up, then cosine decay to 10 % (common for flow / diffusion policies)."""
        cfg = self.cfg
        if update < cfg.warmup_updates:
            return cfg.lr * (update + 1) / cfg.warmup_updates
        progress = (update - cfg.warmup_updates) / max(1, cfg.num_updates - cfg.warmup_updates)
        return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + torch.cos(torch.tensor(min(progress, 1.0) * torch.pi)).item()))

    def update(self, num_updates: int, generator: torch.Generator) -> dict[str, float]:
        cfg, policy = self.cfg, self.policy
        policy.train()
        losses = []
        n = len(self.chunks)
        for _ in range(num_updates):
            lr = self.lr_at(self.updates)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            idx = torch.randint(n, (min(cfg.batch_size, n),), generator=generator, device=self.device)
            chunks = self.chunks[idx]
            t = sample_time(len(idx), cfg.time_sampling, generator, self.device)
            noise = torch.randn(chunks.shape, generator=generator, device=self.device)
            loss = policy.flow_matching_loss({k: v[idx] for k, v in self.obs.items()}, chunks, t, noise, self.mask[idx],
                                             generator)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if self.sync:
                self.sync.gradients(policy.parameters())
            torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
            self.optimizer.step()
            self.updates += 1
            losses.append(loss.item())
        policy.eval()
        return {"flow_matching": float(sum(losses) / len(losses)), "lr": lr}


register_algorithm(AlgorithmSpec(
    name="sft", summary="flow-matching SFT of the flow policy on a LeRobotDataset (pi0's recipe)", config_field="sft",
    config=SFTConfig, policy_kind="flow", runner="rlrobot.runners.sft:SFTRunner", run_fields=(DatasetInput,)))
