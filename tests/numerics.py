"""How close a low-precision result is to its reference, and which FP8 GEMMs ran, defined once for the numerics
tests."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode


def sqnr_db(ref: torch.Tensor, test: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio of `test` against `ref`, in dB (torchao's float8 tests use the same)."""
    ref, test = ref.double(), test.double()
    return (10 * torch.log10(ref.pow(2).sum() / (ref - test).pow(2).sum())).item()


class RecordScaledMM(TorchDispatchMode):
    """(operand a's shape, use_fast_accum) of every FP8 GEMM run under it, and its two scales' numbers of dimensions
    (`scale_dims`)."""

    def __init__(self):
        super().__init__()
        self.calls = []
        self.scale_dims = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._scaled_mm.default:
            fast = args[7] if len(args) > 7 else (kwargs or {}).get("use_fast_accum", False)  # as the schema orders it
            self.calls.append((tuple(args[0].shape), bool(fast)))
            self.scale_dims.append((args[2].dim(), args[3].dim()))
        return func(*args, **(kwargs or {}))


def assert_recorded(buffers, before, amax: float, saturated: int, saturated_tolerance: int = 0) -> None:
    """A site's (amax, saturated) row buffers hold what they held before plus one recording of (amax, saturated), in
    whichever entries: the update reduces each buffer to one number."""
    assert buffers[0].max().item() == pytest.approx(max(before[0].max().item(), amax), rel=1e-2)
    assert (buffers[0] >= before[0]).all()  # max-accumulated: no entry went down
    assert abs(int(buffers[1].sum() - before[1].sum()) - saturated) <= saturated_tolerance
