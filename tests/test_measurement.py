"""Training as a measurement (diagnostics/measurement.py): the throwaway run the probes, the verify tool and the
Amdahl analysis warm up and profile."""

from __future__ import annotations

import dataclasses

import numpy as np

from cs336_basics.build import build
from cs336_basics.config_layers import build_config
from cs336_basics.diagnostics import measurement


def test_a_measurement_trains_in_the_folder_rank_0_names(monkeypatch, tmp_path):
    """Under torchrun every rank must train in rank 0's folder (each checks that it sees rank 0's lock there): the
    measurement's folder is the one broadcast from rank 0, here stood in for by a folder of the test's."""
    rank_0s = tmp_path / "rank0"
    rank_0s.mkdir()
    monkeypatch.setattr(measurement, "broadcast_text", lambda own: str(rank_0s))
    config = build_config({"preset": "cpu-small", "train": {"max_steps": 1, "log_every": 1}}, device_type="cpu")
    tokens = np.arange(20_000, dtype=np.int64) % config.model.vocab_size
    trainer, result = measurement.train_for_measurement(build(config), tokens, tokens, log=lambda message: None)
    assert trainer.config.train.out_dir == str(rank_0s) and result.steps == 1


def test_a_measurement_trains_in_the_runs_parallel_plan(tmp_path):
    """The probes measure what a run does: under torchrun, the plan's DDP or FSDP2 (a measurement once dropped it, so
    every rank trained a replica of its own with no gradient exchanged). A plan of its own stands in for DDP here."""
    config = build_config(
        {"preset": "cpu-small", "train": {"max_steps": 1, "log_every": 1, "out_dir": str(tmp_path)}}, device_type="cpu"
    )
    built = build(config)
    plan = dataclasses.replace(built.parallel, reason="the run's own plan")
    tokens = np.arange(20_000, dtype=np.int64) % config.model.vocab_size
    trainer, _ = measurement.train_for_measurement(
        dataclasses.replace(built, parallel=plan), tokens, tokens, log=lambda message: None
    )
    assert trainer.parallel is plan
