"""Python's garbage collector during training: when it runs, and how long it held each step up.

A step bound by the host (FSDP2's, or any step without CUDA graphs) runs at the speed of the Python that launches
it. Python collects garbage when its allocation counters say so, at a moment of its own on each rank; under torchrun
every rank then waits at the next collective for the one that collected. After the first step has compiled, the
heap also holds everything dynamo and inductor built, which every full collection walks again.

`every > 0` takes the collector off its counters for the training loop: once the first step has compiled, one
collection, then the surviving heap frozen (gc.freeze: no later collection walks it again), then a collection every
`every` steps, on every rank at the same step. `every == 0` leaves Python's collector as it is. Either way the
pauses are timed (gc.callbacks), per step, so that a run's record says what the collector cost it.
"""

from __future__ import annotations

import gc
import time


class StepCollector:
    """The garbage collector's policy and pause clock for one training loop; a context manager."""

    def __init__(self, every: int):
        if every < 0:
            raise ValueError(f"every must be >= 0, got {every}")
        self.every = every
        self._paused_s = 0.0
        self._started: float | None = None
        self._took_over = False

    def __enter__(self) -> StepCollector:
        gc.callbacks.append(self._clock)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._clock)
        if self._took_over:  # hand the process its collector back as it was (a sweep or test trains again)
            gc.unfreeze()
            gc.enable()
            self._took_over = False

    def compiled(self) -> None:
        """The first step has run (and compiled): from here on, collect only every `every` steps."""
        if self.every == 0 or self._took_over or not gc.isenabled():
            return  # Python's own collector, already taken over, or turned off by the caller: left as it is
        gc.collect()
        gc.freeze()
        gc.disable()
        self._took_over = True

    def after_step(self, step: int) -> None:
        """Called after optimizer step `step` (1-based count of steps done)."""
        if self._took_over and step % self.every == 0:
            gc.collect()

    def take_paused_ms(self) -> float:
        """Milliseconds the collector held the host since the last call."""
        paused, self._paused_s = self._paused_s, 0.0
        return 1e3 * paused

    def _clock(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self._paused_s += time.perf_counter() - self._started
            self._started = None
