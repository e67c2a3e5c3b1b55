"""How close a low-precision result is to its reference, defined once for the numerics tests."""

from __future__ import annotations

import torch


def sqnr_db(ref: torch.Tensor, test: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio of `test` against `ref`, in dB (torchao's float8 tests use the same)."""
    ref, test = ref.double(), test.double()
    return (10 * torch.log10(ref.pow(2).sum() / (ref - test).pow(2).sum())).item()
