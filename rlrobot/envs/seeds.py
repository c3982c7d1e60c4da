"""The seed streams of a run. Every env reset of a run takes its seed from one of two streams that never meet, so
training never sees the start states its evaluations are scored on:

- evaluation: ``seed + 10,000 + index`` for index < 10,000 (every evaluation of a run uses index 0: the same start
  states, so evaluations along the learning curve compare like with like);
- training: ``seed + offset`` for the offsets of the run's own resets (1,000 x rank for a rank's first reset, plus
  the iteration where a run restarts its envs), stepping over the evaluation block: offsets from 10,000 on land at
  ``seed + offset + 10,000``.
"""

from __future__ import annotations

EVAL_OFFSET = 10_000
EVAL_BLOCK = 10_000
GROUP_STARTS = 1_000_000
"""training offset of the shared start states of grouped rollouts (Flow-NFT group mode, Flow-SRPO), one per iteration"""
ROLLOUT_SAMPLING = 2_000_000
"""training offset of the seed of an overlapped rollout's own torch generator (its exploration noise)"""


def evaluation_seed(seed: int, index: int = 0) -> int:
    """The evaluation stream's seed ``index`` of a run seeded ``seed``."""
    if not 0 <= index < EVAL_BLOCK:
        raise ValueError(f"evaluation seed index must be in [0, {EVAL_BLOCK}), got {index}")
    return seed + EVAL_OFFSET + index


def training_seed(seed: int, rank: int = 0, index: int = 0) -> int:
    """The training stream's seed for a rank's reset ``index`` (0: its first reset), never an evaluation seed."""
    if rank < 0 or index < 0:
        raise ValueError(f"rank and index must be >= 0, got {rank} and {index}")
    offset = 1_000 * rank + index
    return seed + offset + (EVAL_BLOCK if offset >= EVAL_OFFSET else 0)


def group_start_seed(seed: int, rank: int, iteration: int) -> int:
    """The training-stream seed of iteration ``iteration``'s shared start states (grouped rollouts)."""
    return training_seed(seed, rank, GROUP_STARTS + iteration)
