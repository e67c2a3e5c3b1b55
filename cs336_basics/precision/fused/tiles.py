"""The tiling every FP8 cast kernel of the fused path shares (Triton, CUDA): one program per tile of BLOCK_M rows x
BLOCK_F columns of a row-major (M, F) tensor; 128 rows give 128-byte runs in the transposed FP8 stores."""

from __future__ import annotations

import triton
import triton.language as tl

BLOCK_M, BLOCK_F, WARPS = 128, 64, 8


def tile_grid(m: int, f: int) -> tuple[int, int]:
    return triton.cdiv(m, BLOCK_M), triton.cdiv(f, BLOCK_F)


@triton.jit
def tile_offsets(M, F, BLOCK_M: tl.constexpr, BLOCK_F: tl.constexpr):
    """This program's tile: offsets into the row-major (M, F) tensors and their (F, M) transposes, and the mask."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    mask = (rows < M)[:, None] & (cols < F)[None, :]
    offs = rows[:, None].to(tl.int64) * F + cols[None, :]
    offs_t = cols[None, :].to(tl.int64) * M + rows[:, None]
    return offs, offs_t, mask
