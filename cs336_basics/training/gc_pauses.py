"""How long Python's garbage collector held the host up, step by step.

A step bound by the host (FSDP2's, or any step without CUDA graphs) runs at the speed of the Python that launches it,
and under torchrun every rank waits at each collective for the slowest: a collection on one rank, at a moment of its
own, would delay them all. The Trainer records these pauses per step beside the host's time, so that a run's record
says whether the collector is what a slow step spent its time on.
"""

from __future__ import annotations

import gc
import time


class GcPauses:
    """The collector's pauses while in this context (gc.callbacks); a context manager."""

    def __init__(self):
        self._paused_s = 0.0
        self._started: float | None = None

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._clock)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._clock)

    def take_ms(self) -> float:
        """Milliseconds the collector held the host since the last call."""
        paused, self._paused_s = self._paused_s, 0.0
        return 1e3 * paused

    def _clock(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self._paused_s += time.perf_counter() - self._started
            self._started = None
