"""The garbage collector's pauses (training/gc_pauses.py) and the host's view of each training step."""

import gc

from test_trainer import make_trainer, tiny_config

from cs336_basics.training.gc_pauses import GcPauses
from cs336_basics.training.metrics import read_metrics


def test_the_collectors_pauses_are_timed_once_and_only_inside_the_context():
    callbacks = list(gc.callbacks)
    with GcPauses() as pauses:
        pauses.take_ms()
        gc.collect()
        assert pauses.take_ms() > 0
        assert pauses.take_ms() == 0  # taken: counted once
    gc.collect()
    assert pauses.take_ms() == 0 and gc.callbacks == callbacks


def test_a_run_records_each_timed_steps_host_time_cpu_time_and_collector_pauses(tmp_path):
    trainer = make_trainer(tiny_config(tmp_path, max_steps=8, checkpoint_every=0))
    step = trainer.train_step

    def step_then_collect():  # a collection inside each step: its pause must land in that step's gc_ms
        result = step()
        gc.collect()
        return result

    trainer.train_step = step_then_collect
    result = trainer.train()
    [host_ms], [cpu_ms], [gc_ms] = result.host_ms, result.host_cpu_ms, result.gc_ms  # one list: one process
    assert len(host_ms) == len(cpu_ms) == len(gc_ms) == len(result.step_ms) == 6  # the timed steps
    assert all(ms > 0 for ms in host_ms + cpu_ms + gc_ms)
    assert all(gc_step <= host for gc_step, host in zip(gc_ms, host_ms, strict=True))


def test_the_last_step_is_logged_and_timed_whatever_the_log_interval(tmp_path):
    """A run whose last step falls between log points still records it: its loss is the result's, and every timed
    step's device time has its host series beside it."""
    cfg = tiny_config(tmp_path, max_steps=7, log_every=3, eval_every=0, checkpoint_every=0)
    result = make_trainer(cfg).train()
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [3, 6, 7]
    assert len(result.step_ms) == len(result.host_ms[0]) == 5  # steps 3 to 7
