"""The optimizer-step benchmark: its baseline must compute the same update as ours, or the comparison is unfair."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cs336_basics.optim import MasterWeightAdamW
from lab import optimizer_step


def test_unfused_baseline_matches_master_weight_adamw():
    torch.manual_seed(0)
    shapes = [(16, 8), (8,), (32, 16)]
    ours = [nn.Parameter(torch.randn(s).to(torch.bfloat16)) for s in shapes]
    theirs = [nn.Parameter(p.detach().clone()) for p in ours]
    opt = MasterWeightAdamW([(f"p{i}", p) for i, p in enumerate(ours)], **optimizer_step.HP)
    baseline = optimizer_step.UnfusedMasterAdamW(theirs)
    for step in range(3):
        grads = [torch.randn(s) * (10 if step == 1 else 0.01) for s in shapes]  # step 1 is clipped
        for p, q, g in zip(ours, theirs, grads, strict=True):
            p.grad, q.grad = g.to(torch.bfloat16), g.to(torch.bfloat16)
        opt.step(max_grad_norm=optimizer_step.MAX_GRAD_NORM)
        baseline.step()
    for m, bm in zip(opt.masters, baseline.masters, strict=True):
        torch.testing.assert_close(m, bm, rtol=1e-5, atol=1e-6)
    for p, q in zip(ours, theirs, strict=True):
        assert torch.equal(p, q)


def test_refuses_to_run_without_cuda(capsys):
    if torch.cuda.is_available():
        pytest.skip("checks the CPU-only error")
    assert optimizer_step.main(["--presets", "cpu-small"]) == 2
    assert "GPU" in capsys.readouterr().err
