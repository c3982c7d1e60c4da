"""Bounded running statistics for long-running processes (a server up for weeks, a deploy of many episodes).

``RunningStats`` keeps an exact count / mean / min / max and the last ``window`` samples for percentiles, so its
memory is fixed however many samples arrive. It has ``append`` so it can stand in for a list of samples.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

import numpy as np


class RunningStats:
    def __init__(self, window: int = 4096, scale: float = 1.0):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.scale = scale
        self.recent: deque[float] = deque(maxlen=window)
        self.count = 0
        self.total = 0.0
        self.min = math.inf
        self.max = -math.inf

    def append(self, value: float) -> None:
        value = float(value) * self.scale
        self.recent.append(value)
        self.count += 1
        self.total += value
        self.min = min(self.min, value)
        self.max = max(self.max, value)

    def extend(self, values: Iterable[float]) -> None:
        for v in values:
            self.append(v)

    def __len__(self) -> int:
        return self.count

    def last(self, n: int) -> list[float]:
        return list(self.recent)[-n:]

    def summary(self) -> dict[str, float]:
        """count, mean and max over all samples; median and p99 over the last ``window`` samples."""
        if not self.count:
            return {"count": 0}
        recent = np.asarray(self.recent)
        return {"count": self.count, "mean_ms": self.total / self.count, "median_ms": float(np.median(recent)),
                "p99_ms": float(np.percentile(recent, 99)), "max_ms": self.max, "window": len(recent)}
