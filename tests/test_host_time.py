"""The host-time profile's wiring: what it refuses before any work (its measurements need a GPU: the benchmark's
results are committed under benchmarks/results/)."""

from __future__ import annotations

import pytest
import torch

from cs336_basics.benchmark import host_time


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_refuses_without_a_gpu(capsys):
    assert host_time.main(["--presets", "gpt2-small"]) != 0
    assert "needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.parametrize(("flag", "value"), [("--precisions", "bf16,fp7"), ("--compile", "fastest")])
def test_refuses_unknown_precisions_and_compile_modes(monkeypatch, capsys, flag, value):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the check comes before any CUDA work
    assert host_time.main([flag, value]) != 0
    assert value.split(",")[-1] in capsys.readouterr().err
