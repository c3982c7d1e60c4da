"""Data-parallel training with torch.distributed, launched by ``torchrun --nproc-per-node N -m rlrobot train
--distributed ...``.

Each rank owns its env batch and seed (``rlrobot.envs.seeds.training_seed(seed, rank)``); parameters and buffers are
broadcast from rank 0 at start;
gradients are all-reduced (averaged) before every optimizer step; statistics that steer the update (advantage
mean / std, the adaptive-lr KL) and the observation normaliser's data are reduced across ranks, so every rank takes
exactly the step one process would take on the union of the batches. Rank 0 alone logs, checkpoints and evaluates.
gloo on CPU, NCCL on GPU. No home-made cluster code: torchrun sets RANK / WORLD_SIZE / MASTER_ADDR.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import torch
import torch.distributed as dist


class NoSync:
    """Single process: every reduction is the identity."""

    rank = 0
    world_size = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def mean(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def gradients(self, params: Iterable[torch.nn.Parameter]) -> None:
        return None

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def global_mean_std(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.mean(), x.std()


class DataParallel(NoSync):
    """Reductions over the default process group (every rank holds the same number of samples)."""

    def __init__(self):
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()

    def mean(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.as_tensor(x, dtype=torch.float32).clone()
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
        return x / self.world_size

    def gradients(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Average the gradients of ``params`` over ranks in one flat all-reduce."""
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat /= self.world_size
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's ``x`` along dim 0 (equal shapes)."""
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts)

    def global_mean_std(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and unbiased std of the union of every rank's ``x`` (what ``x.std()`` gives in one process)."""
        n = x.numel() * self.world_size
        mean = self.mean(x.mean())
        mean_sq = self.mean(x.square().mean())
        var = (mean_sq - mean.square()) * n / max(n - 1, 1)
        return mean, var.clamp_min(0.0).sqrt()


def init_distributed(device: str) -> tuple[DataParallel, torch.device]:
    """Join the process group torchrun describes; returns the sync object and this rank's device."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise ValueError("--distributed needs to be launched by torchrun (RANK / WORLD_SIZE are not set): "
                         "torchrun --nproc-per-node N -m rlrobot train --distributed ...")
    use_cuda = device.startswith("cuda")
    if use_cuda:
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local_rank)
        run_device = torch.device("cuda", local_rank)
    else:
        run_device = torch.device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    return DataParallel(), run_device


@torch.no_grad()
def broadcast_module(module: torch.nn.Module, src: int = 0) -> None:
    """Make every rank's parameters and buffers equal to rank ``src``'s."""
    for tensor in list(module.parameters()) + list(module.buffers()):
        dist.broadcast(tensor.data, src)


@torch.no_grad()
def parameters_identical(module: torch.nn.Module, sync: NoSync) -> bool:
    """True when every rank holds bit-identical parameters and buffers (compared by all-gathered checksums)."""
    if sync.world_size == 1:
        return True
    values = torch.cat([t.detach().reshape(-1).double() for t in list(module.parameters()) + list(module.buffers())])
    weights = torch.arange(1, values.numel() + 1, dtype=torch.float64, device=values.device).remainder(997) + 1
    checksum = torch.stack([values.sum(), (values * weights).sum(), values.abs().max()])
    gathered = sync.gather(checksum[None])
    return bool((gathered == gathered[0]).all())


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
