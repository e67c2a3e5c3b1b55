"""The transposed copy of an FP8 tensor as a Triton kernel of its own (CUDA), for delayed scaling.

Every FP8 operand is also needed transposed (the backward GEMMs take their operands K-major). With dynamic scaling
inductor writes both layouts in one tiled pointwise kernel after the amax pass. With delayed scaling the cast also
reduces its tensor row by row (scaling.py), and inductor then folds the transposed writes into that row-reduction
kernel, where each row's values go to a column of the transpose: one-byte stores a row apart, several times slower
than the cast itself at the 1.3b shape (INDEX.md: 2026-11-23-delayed-transpose-h200). As a custom op the
transpose stays a kernel of its own: tiles of the row-major FP8 tensor read once, written transposed.

Imported only on CUDA machines: triton ships with torch's Linux CUDA wheels.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from cs336_basics.kernels.tiles import TRANSPOSE_TILE, tile_offsets


@triton.jit
def _transpose_kernel(x_ptr, out_ptr, M, F, BLOCK_M: tl.constexpr, BLOCK_F: tl.constexpr):
    offs, offs_t, mask = tile_offsets(M, F, BLOCK_M, BLOCK_F)
    tl.store(out_ptr + offs_t, tl.load(x_ptr + offs, mask=mask), mask=mask)


@triton_op("cs336_fp8::transpose", mutates_args={})
def transpose(x: torch.Tensor) -> torch.Tensor:
    """x^T, row-major, for a contiguous 2-D CUDA tensor x (any dtype; used for FP8)."""
    if x.dim() != 2 or not x.is_contiguous() or not x.is_cuda:
        raise ValueError("the transpose kernel takes a contiguous 2-D CUDA tensor")
    m, f = x.shape
    out = torch.empty(f, m, device=x.device, dtype=x.dtype)
    wrap_triton(_transpose_kernel)[TRANSPOSE_TILE.grid(m, f)](x, out, m, f, **TRANSPOSE_TILE.launch_options())
    return out
