"""The tiling every FP8 cast kernel of the fused path shares (Triton, CUDA): one program per tile of block_m rows x
block_f columns of a row-major (M, F) tensor, which it reads once and writes in FP8, row-major and transposed.

Each kernel has its own tile size and warp count, the fastest of those measured for it at the 366m and 1.3b shapes
on an H200, each also faster than the one tile they all had before on an H100
(benchmarks/results/2026-11-25-tile-sizes-h200/README.md)."""

from __future__ import annotations

from typing import NamedTuple

import triton
import triton.language as tl


class Tile(NamedTuple):
    block_m: int
    block_f: int
    warps: int

    def grid(self, m: int, f: int) -> tuple[int, int]:
        return triton.cdiv(m, self.block_m), triton.cdiv(f, self.block_f)

    def launch_options(self) -> dict[str, int]:
        """The kernel's tile constants and warp count, as a launch takes them."""
        return {"BLOCK_M": self.block_m, "BLOCK_F": self.block_f, "num_warps": self.warps}


TRANSPOSE_TILE = Tile(128, 128, 8)
SWIGLU_TILE = Tile(32, 128, 4)
SWIGLU_GRAD_TILE = Tile(32, 64, 4)
# Chosen on an H200 only (benchmarks/results/2026-11-26-fused-rope-h200/README.md); not yet timed on an H100.
ROPE_GRAD_TILE = Tile(32, 64, 8)


@triton.jit
def tile_offsets(M, F, BLOCK_M: tl.constexpr, BLOCK_F: tl.constexpr):
    """This program's tile: offsets into the row-major (M, F) tensors and their (F, M) transposes, and the mask."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    mask = (rows < M)[:, None] & (cols < F)[None, :]
    offs = rows[:, None].to(tl.int64) * F + cols[None, :]
    offs_t = cols[None, :].to(tl.int64) * M + rows[:, None]
    return offs, offs_t, mask
