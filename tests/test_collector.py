"""The garbage collector's policy during training (training/collector.py) and the host's view of each step."""

import gc
import weakref

import pytest
from test_trainer import make_trainer, tiny_config

from cs336_basics.training.collector import StepCollector


class _Cycle:
    """Garbage only the collector frees: it refers to itself."""

    def __init__(self):
        self.me = self


def _cycle_garbage() -> weakref.ref:
    return weakref.ref(_Cycle())


def test_every_zero_leaves_pythons_collector_as_it_is_and_times_its_pauses():
    with StepCollector(0) as collector:
        collector.compiled()
        assert gc.isenabled() and gc.get_freeze_count() == 0
        collector.take_paused_ms()
        gc.collect()
        assert collector.take_paused_ms() > 0
        assert collector.take_paused_ms() == 0  # taken: counted once


def test_every_n_collects_only_every_n_steps_after_compiling_and_gives_the_collector_back():
    with StepCollector(3) as collector:
        collector.compiled()
        assert not gc.isenabled()
        assert gc.get_freeze_count() > 0  # the heap left after compiling is frozen
        garbage = _cycle_garbage()
        for step in (1, 2):
            collector.after_step(step)
            assert garbage() is not None  # no collection yet: the counters no longer trigger one
        collector.take_paused_ms()
        collector.after_step(3)
        assert garbage() is None
        assert collector.take_paused_ms() > 0
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_collector_the_caller_turned_off_stays_off():
    gc.disable()
    try:
        with StepCollector(2) as collector:
            collector.compiled()
            assert gc.get_freeze_count() == 0
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_every_must_not_be_negative():
    with pytest.raises(ValueError, match=">= 0"):
        StepCollector(-1)


@pytest.mark.parametrize("gc_every", [0, 2])
def test_a_run_records_each_timed_steps_host_time_cpu_time_and_collector_pauses(tmp_path, gc_every):
    callbacks = list(gc.callbacks)
    result = make_trainer(tiny_config(tmp_path, max_steps=8, checkpoint_every=0, gc_every=gc_every)).train()
    [host_ms], [cpu_ms], [gc_ms] = result.host_ms, result.host_cpu_ms, result.gc_ms  # one list: one process
    assert len(host_ms) == len(cpu_ms) == len(gc_ms) == len(result.step_ms) == 6  # the timed steps
    assert all(ms > 0 for ms in host_ms) and all(ms >= 0 for ms in cpu_ms + gc_ms)
    if gc_every:  # collections after steps 4, 6 and 8: the first two fall in the timed steps 5 and 7
        assert sum(ms > 0 for ms in gc_ms) >= 2
    assert gc.isenabled() and gc.get_freeze_count() == 0 and gc.callbacks == callbacks
