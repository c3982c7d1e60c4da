"""Overlapped rollout and update for the on-policy runners (``--ppo.overlap``, ``--flow-ppo.overlap``).

APPO / Sample Factory's one-step staleness on two threads of one process. Iteration i collects rollout i with a copy
of the policy (the *actor*) while the update of rollout i - 1 runs on a worker thread; then it waits for that update,
copies the updated weights into the actor and starts the update of rollout i. So rollout i is acted by the policy
from before the update of rollout i - 1, one update older than the policy its own update starts from.

Off-policy correction: decoupled PPO (Hilton et al. 2021, "Batch size-invariance for policy optimization"). The
storage keeps the acting (behaviour) policy's log-probs; the update first computes the stored samples' log-probs under
the policy it starts from (the proximal policy), then takes the ratio pi_theta / pi_proximal, clips it and measures the
KL (adaptive lr, flow PPO's max_kl) around that policy, and weights each sample's advantage by pi_proximal /
pi_behaviour, the importance weight of the one-update-old samples. APPO's plain form, the ratio and clip around the
behaviour policy, learned more slowly on so101-reach: the previous update has already spent part of the clip range
and of the KL budget, so the adaptive lr fell 10-100x lower. GAE uses the values the behaviour policy's critic gave,
as APPO without V-trace does.

Both threads spend most of their time where the GIL is released (MuJoCo's ``mj_step`` in the simulator's thread pool,
torch's kernels), so the rollout and the update share the cores. The two keep separate random streams, so a seeded run
is reproducible whatever the threads' timing: the update draws its minibatch order from the run's generator; PPO's
rollout draws its actions from torch's global stream (which the update does not touch), flow PPO's rollout its chains
from a generator of its own (saved in checkpoints). The pipeline drains (the update runs in the iteration
that collected its rollout) before every evaluation, checkpoint and the end, so those see a whole, current policy and a
resumed run continues exactly; the rollout after a drain acts with the current policy.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import torch
from torch import nn

from rlrobot.data.rollout_storage import RolloutStorage


class OverlappedUpdates:
    """The actor (a copy of the policy the rollouts act with), the spare rollout storage, the rollout's generator and
    the worker thread the updates run on."""

    def __init__(self, policy: nn.Module, spare: RolloutStorage, generator: torch.Generator, update_threads: int):
        self.actor = copy.deepcopy(policy).requires_grad_(False)
        self.spare = spare
        self.generator = generator
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="rlrobot-update", initializer=torch.set_num_threads,
                                            initargs=(update_threads,))
        self._pending: Future | None = None

    @property
    def pending(self) -> bool:
        return self._pending is not None

    @torch.no_grad()
    def sync_actor(self, policy: nn.Module) -> None:
        """The actor takes the policy's current weights and buffers (observation normaliser)."""
        for dst, src in zip(self.actor.parameters(), policy.parameters(), strict=True):
            dst.copy_(src)
        for dst, src in zip(self.actor.buffers(), policy.buffers(), strict=True):
            dst.copy_(src)

    def wait(self) -> dict[str, float] | None:
        """The statistics of the update in flight once it has finished (None when none was running)."""
        if self._pending is None:
            return None
        future, self._pending = self._pending, None
        return future.result()

    def iteration(self, policy: nn.Module, algo, collect: Callable[[nn.Module, RolloutStorage, torch.Generator], dict],
                  learn: Callable[[], dict[str, float]], drain: bool) -> dict[str, float]:
        """One overlapped iteration: ``collect(actor, storage, generator)`` a rollout while the previous one's update
        finishes, then hand the new rollout to ``algo`` and start ``learn()`` on it (in this iteration when ``drain``)."""
        start = time.perf_counter()
        if self._pending is None:  # nothing in flight: the rollout acts with the current policy
            self.sync_actor(policy)
        self.spare.clear()
        rollout_stats = collect(self.actor, self.spare, self.generator)
        collected = time.perf_counter()
        update_stats = self.wait()
        if update_stats is not None:
            self.sync_actor(policy)  # the next rollout acts with the policy this update made
        waited = time.perf_counter() - collected
        algo.storage, self.spare = self.spare, algo.storage
        self._pending = self._executor.submit(learn)  # on the worker either way: the same threads for every update
        if drain:
            update_stats = self.wait()
        total = time.perf_counter() - start
        metrics = {"perf/rollout_fraction": (collected - start) / total, "perf/update_wait_fraction": waited / total,
                   **rollout_stats}
        if update_stats is not None:  # the statistics of the update that finished in this iteration
            metrics.update({f"loss/{k}": v for k, v in update_stats.items()})
        return metrics

    def close(self) -> None:
        self.wait()
        self._executor.shutdown(wait=True)
