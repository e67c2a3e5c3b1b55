"""GPU timing, in one place: CUDA events around the work, read back with one synchronisation.

Two uses: `StepTimer` times whole training steps without making any step wait (the Trainer reads the times at
its log points), and `time_calls_ms` times calls of a function after a warm-up, for benchmarks.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch


class StepTimer:
    """Times steps without synchronising: CUDA events on GPU, the host clock on CPU (where every op already runs
    synchronously). Durations are read in bulk by `collect`."""

    def __init__(self, device: torch.device):
        self.cuda = torch.device(device).type == "cuda"
        self._pending: list[tuple[int, Any, Any]] = []

    def start(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def stop(self, step: int, started: Any) -> None:
        if self.cuda:
            ended = torch.cuda.Event(enable_timing=True)
            ended.record()
            self._pending.append((step, started, ended))
        else:
            self._pending.append((step, started, time.perf_counter()))

    def collect(self) -> list[tuple[int, float]]:
        """(step, seconds) for every step since the last collect; synchronises once on GPU."""
        if self.cuda:
            torch.cuda.synchronize()
            out = [(s, a.elapsed_time(b) / 1e3) for s, a, b in self._pending]
        else:
            out = [(s, b - a) for s, a, b in self._pending]
        self._pending.clear()
        return out


def time_calls_ms(fn: Callable[[], Any], calls: int, *, warmup: int = 0, batch: int = 1) -> list[float]:
    """Per-call GPU time in ms of `calls` timed rounds of `fn` (each round runs it `batch` times back to back,
    and reports the mean), after `warmup` untimed calls. Synchronises once before and once after."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    timer = StepTimer(torch.device("cuda"))
    for i in range(calls):
        started = timer.start()
        for _ in range(batch):
            fn()
        timer.stop(i, started)
    return [1e3 * seconds / batch for _, seconds in timer.collect()]


def calls_per_round(fn: Callable[[], Any], min_round_ms: float, most: int = 200) -> int:
    """How many back-to-back calls of `fn` make a timed round of at least `min_round_ms` (short kernels are timed
    in rounds so that the event overhead does not dominate)."""
    (once,) = time_calls_ms(fn, 1)
    return max(1, min(most, math.ceil(min_round_ms / max(once, 1e-3))))
