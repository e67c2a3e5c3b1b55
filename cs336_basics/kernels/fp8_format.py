"""The FP8 formats and the plain-torch cast every FP8 implementation shares: the Triton kernels here, their torch
references and the scaling in precision/fused/scaling.py. A module of its own, beneath both, so that a kernel never
imports the scaling code that launches it."""

from __future__ import annotations

import torch

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2


def fp8_max(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).max


def cast_to_fp8(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Saturating cast: values whose scaled magnitude exceeds the format's max become +-max, never inf/nan."""
    limit = fp8_max(dtype)
    return (x.float() * scale).clamp(-limit, limit).to(dtype)


def record_into_entry0(
    value: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, amax_rows: torch.Tensor, saturated_rows: torch.Tensor
) -> None:
    """The torch references' recording of a whole cast tensor (the Triton kernels file theirs per tile): value's amax
    max-accumulated and its count of values beyond the scale's range added into entry 0 of a site's row buffers."""
    magnitude = value.abs().float()
    amax_rows[:1] = torch.maximum(amax_rows[:1], magnitude.amax())
    saturated_rows[:1] += (magnitude * scale > fp8_max(dtype)).sum(dtype=torch.int32)
