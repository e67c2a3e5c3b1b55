"""Stopping a run on SIGINT (Ctrl-C) and SIGTERM (what schedulers, containers and `timeout` send), the same way.

During training the first signal only records a stop request: the loop finishes the step it is in, saves a
checkpoint at that step boundary (so the saved data-sampler position, optimizer state and step agree) and exits
with 128 + the signal number (130 / 143). A second Ctrl-C stops at once without saving, except while a checkpoint
is being written: then it waits for the write to complete. Repeated SIGTERMs are one request: `timeout` and job
schedulers send SIGTERM to the process and to its process group, so one stop often arrives twice, and they follow
it with SIGKILL when they mean "now". Outside training, both signals end the process with a message
(`terminate_raises`).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """The run was stopped by a signal. `exit_code` is the shell's convention: 128 + the signal number."""

    def __init__(self, signum: int, message: str = ""):
        super().__init__(message or f"stopped by {signal.Signals(signum).name}")
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class StopNow(Interrupted):
    """A second Ctrl-C: the run stops where it is, without writing a checkpoint."""


def _raise_interrupted_once(signum: int, frame: object) -> None:
    # Later SIGTERMs are the same request (`timeout` signals the process, then its process group): raised again,
    # one would cut short the clean-up the first started (stopping a worker with its grace).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Interrupted(signum)


def ignore_terminate() -> None:
    """From now on SIGTERM does nothing: for a process already leaving with an error of its own, whose report a stop
    request must not replace. Signal handlers can only be set from the main thread; elsewhere this does nothing."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


@contextlib.contextmanager
def terminate_raises() -> Iterator[None]:
    """While held, SIGTERM ends the work the way Ctrl-C does (an exception the script reports) instead of killing
    the process without a word; the SIGTERMs after it are ignored until the block exits. Signal handlers can only be
    set from the main thread; elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_interrupted_once)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class GracefulStop:
    """Context manager that turns the first stop signal into a request polled at step boundaries."""

    def __init__(self, log: Callable[[str], None] = print, saves: bool = True):
        self.signum: int | None = None
        self._log = log
        self._saves = saves  # whether the stop writes a checkpoint (a run with --checkpoint_every 0 writes none)
        self._writing = 0
        self._abort_after_write = False
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():  # handlers can only be set there
            self._previous = {s: signal.signal(s, self._handle) for s in STOP_SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    def _handle(self, signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        if self.signum is None:
            self.signum = signum
            if self._saves:
                again = " (Ctrl-C again to stop without saving)" if signum == signal.SIGINT else ""
                self._log(f"\n{name}: stopping after this step with a checkpoint{again}")
            else:
                self._log(f"\n{name}: stopping after this step (this run writes no checkpoints)")
        elif signum != signal.SIGINT:
            return  # the same stop request again (see the module docstring)
        elif self._writing:
            self._abort_after_write = True
            self._log(f"\n{name}: a checkpoint is being written; stopping as soon as it is complete")
        else:
            raise StopNow(signum, f"stopped by {name} (a second Ctrl-C) without saving")

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Hold while writing a checkpoint: a second signal then waits for the write instead of cutting it."""
        self._writing += 1
        try:
            yield
        finally:
            self._writing -= 1
        if self._abort_after_write and not self._writing:
            raise StopNow(signal.SIGINT, "stopped by a second Ctrl-C, after the checkpoint write")
