"""The memory-peak probe: its replay of an allocator trace, the sites it names, and its refusals (its measurements
need a GPU: the marked test runs one)."""

from __future__ import annotations

import pytest
import torch

from lab import memory_peak


def event(action: str, addr: int, size: int, *files: str) -> dict:
    frames = [{"filename": f, "line": 1, "name": "fn"} for f in files]
    return {"action": action, "addr": addr, "size": size, "frames": frames}


def test_the_replay_finds_the_peak_and_what_is_alive_there():
    trace = [
        event("alloc", 1, 100, "/a/model.py"),
        event("alloc", 2, 300, "/a/head.py"),
        event("free_requested", 1, 100),  # not yet free: only a completed free counts
        event("alloc", 3, 50, "/a/head.py"),  # the peak: 10 + 100 + 300 + 50
        event("free_completed", 1, 100),
        event("free_completed", 2, 300),
        event("alloc", 4, 400, "/a/loss.py"),  # 10 + 50 + 400: below the peak
    ]
    peak, index, live = memory_peak.live_at_peak(trace, start_bytes=10)
    assert (peak, index) == (460, 3)
    assert sorted(block["addr"] for block in live) == [1, 2, 3]
    rows = memory_peak.grouped(live + [event("alloc", 5, 300, "/a/head.py")], top=2)
    assert rows[0]["count"] == 2 and rows[0]["total_mib"] == 600 / 2**20 and "head.py" in rows[0]["site"]
    assert len(rows) == 2


def test_the_site_skips_torchs_own_frames():
    block = event("alloc", 1, 8, "/x/site-packages/torch/nn/modules/module.py", "/repo/cs336_basics/model/layers.py")
    assert memory_peak.allocation_site(block).startswith("layers.py:1:fn")
    assert memory_peak.allocation_site(event("alloc", 1, 8)) == "<no Python frame>"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_refuses_without_a_gpu(capsys):
    assert memory_peak.main(["--presets", "gpt2-small"]) != 0
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_refuses_unknown_precisions(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the check comes before any CUDA work
    assert memory_peak.main(["--precisions", "bf16,fp7"]) != 0
    assert "fp7" in capsys.readouterr().err


@pytest.mark.gpu
def test_a_probe_of_a_real_step_accounts_for_its_peak():
    record = memory_peak.measure("cpu-small", fp8=True, compile_mode="default", warmup=2, top=5)
    assert record["status"] == "ok" and record["live_at_peak"]
    # The replay's peak is the allocator's own, and what it lists is part of it.
    assert record["replayed_peak_gib"] == pytest.approx(record["peak_mem_gib"], rel=0.01)
    assert 0 < record["in_step_at_peak_gib"] <= record["replayed_peak_gib"]
