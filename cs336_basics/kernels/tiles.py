"""The tiling every FP8 cast kernel of the fused path shares (Triton, CUDA): one program per tile of block_m rows x
block_f columns of a row-major (M, F) tensor, which it reads once and writes in FP8, row-major and transposed.

Each kernel has its own tile size and warp count, the fastest of those measured for it at the 366m and 1.3b shapes
on an H200, each also faster than the one tile they all had before on an H100
(INDEX.md: 2026-11-25-tile-sizes-h200)."""

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
# Chosen on an H200 only (INDEX.md: 2026-11-26-fused-rope-h200); not yet timed on an H100.
ROPE_GRAD_TILE = Tile(32, 64, 8)
WEIGHT_CAST_TILE = Tile(64, 128, 4)  # cast_triton.py's: not tuned


@triton.jit
def tile_offsets(M, F, BLOCK_M: tl.constexpr, BLOCK_F: tl.constexpr):
    """This program's tile: offsets into the row-major (M, F) tensors and their (F, M) transposes, and the mask."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    mask = (rows < M)[:, None] & (cols < F)[None, :]
    offs = rows[:, None].to(tl.int64) * F + cols[None, :]
    offs_t = cols[None, :].to(tl.int64) * M + rows[:, None]
    return offs, offs_t, mask


@triton.jit
def saturating_cast(value, scale, LIMIT: tl.constexpr, dtype: tl.constexpr):
    """scaling.cast_to_fp8's arithmetic in a kernel, which the tests hold the kernels to bit for bit: the float32
    product, clamped to the format's max (+-LIMIT: saturation, never inf), converted to FP8 `dtype`."""
    return tl.minimum(tl.maximum(value * scale, -LIMIT), LIMIT).to(dtype)


@triton.jit
def record_tile(magnitude, scale, amax_ptr, saturated_ptr, recorded_rows, LIMIT: tl.constexpr):
    """Delayed scaling's recording of one tile of a cast (|values|, 2-D, masked-out entries 0): the tile's amax
    max-accumulated and its count of values beyond the scale's range added into a site's row buffers, at entry
    (program id modulo the buffers' length). The once-per-step update reduces each buffer to one number, so any entry
    will do; atomically, as other programs of the launch may share it. One pair of atomics per tile rather than per
    row, whose values are spread over many programs; relaxed, as nothing in the launch reads them (Triton's default,
    acq_rel, fences every program's memory traffic around them)."""
    program = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
    entry = program % recorded_rows
    tl.atomic_max(amax_ptr + entry, tl.max(magnitude), sem="relaxed")
    tl.atomic_add(saturated_ptr + entry, tl.sum((magnitude * scale > LIMIT).to(tl.int32)), sem="relaxed")
