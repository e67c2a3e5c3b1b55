"""The q/k/v gradients' FP8 producer as a Triton kernel (CUDA): RoPE's backward, the FP8 cast, its transposed copy and
the per-row recordings of delayed scaling in one pass over attention's gradient.

Unfused, RoPE's backward writes q's and k's gradients in BF16 in attention's (batch, heads, seq, head_dim) layout and
the projection's cast reads them back token-major, reducing each token's row across the heads: inductor fused the
two into one kernel that ran at a fraction of the memory bandwidth, then a separate kernel wrote the transposed copy
(benchmarks/results/2026-11-25-kernel-profiles-h200/README.md). Here each program reads a tile of tokens x channels
of the gradient (any strides; the channels in whole heads, which share their angles), rotates it back, and writes it
in FP8 row-major and transposed; with delayed scaling each row's amax and saturation count go straight into the
site's own row buffers (atomically: a row's heads are spread over a few programs), with no kernel of their own.
The operations, their signatures and numerics are rope_reference.py's; tests compare the two on the GPU. They are
torch custom ops (torch.library.triton_op), so torch.compile keeps them in its graph (fullgraph).

Imported only on CUDA machines: triton ships with torch's Linux CUDA wheels.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from cs336_basics.precision.fused.scaling import E5M2, fp8_max
from cs336_basics.precision.fused.tiles import ROPE_GRAD_TILE, Tile


@triton.jit
def _rope_grad_kernel(
    g_ptr, cos_ptr, sin_ptr, pos_ptr, out_ptr, out_t_ptr, scale_ptr, amax_ptr, sat_ptr,
    M, F, seq, heads, head_dim, stride_b, stride_h, stride_s, stride_d, pos_stride_b, recorded_rows,
    LIMIT: tl.constexpr, ROTATE: tl.constexpr, POSITIONS: tl.constexpr, CAST: tl.constexpr, RECORD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    # A tile is BLOCK_M tokens (rows of the token-major gradient: batch * seq) x BLOCK_H heads x BLOCK_D channels of a
    # head (head_dim, padded to a power of two), so that the heads of a tile share one load of the angles.
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    head = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    dim = tl.arange(0, BLOCK_D)
    batch, pos = rows // seq, rows % seq
    r3, h3, d3 = rows[:, None, None], head[None, :, None], dim[None, None, :]
    mask = (r3 < M) & (h3 < heads) & (d3 < head_dim)
    token = batch.to(tl.int64)[:, None, None] * stride_b + pos.to(tl.int64)[:, None, None] * stride_s
    at = g_ptr + token + h3 * stride_h
    g = tl.load(at + d3 * stride_d, mask=mask, other=0.0).to(tl.float32)
    if ROTATE:
        # Channel pairs (2i, 2i+1) were rotated by pos * theta_i: rotate back, pairing each channel with its partner.
        partner = tl.load(at + (d3 ^ 1) * stride_d, mask=mask, other=0.0).to(tl.float32)
        if POSITIONS:
            pos = tl.load(pos_ptr + batch * pos_stride_b + pos, mask=rows < M, other=0)
        angle = pos.to(tl.int64)[:, None, None] * (head_dim // 2) + d3 // 2
        angle_mask = (r3 < M) & (d3 < head_dim)
        cos = tl.load(cos_ptr + angle, mask=angle_mask, other=0.0)
        sin = tl.load(sin_ptr + angle, mask=angle_mask, other=0.0)
        sign = tl.where(d3 % 2 == 0, 1.0, -1.0)
        # Rounded to BF16 as the unfused backward writes it.
        g = (g * cos + sign * partner * sin).to(tl.bfloat16).to(tl.float32)
    magnitude = tl.abs(g)
    if CAST:
        scale = tl.load(scale_ptr)
        y = tl.minimum(tl.maximum(g * scale, -LIMIT), LIMIT).to(out_ptr.dtype.element_ty)
        channel = h3 * head_dim + d3
        tl.store(out_ptr + r3.to(tl.int64) * F + channel, y, mask=mask)
        tl.store(out_t_ptr + channel.to(tl.int64) * M + r3, y, mask=mask)
        if RECORD:
            # Max-accumulated into the site's own row buffer (entry: row modulo its length), as SiteScaling.cast does.
            entry = rows % recorded_rows
            saturated = tl.sum(tl.sum((magnitude * scale > LIMIT).to(tl.int32), axis=2), axis=1)
            tl.atomic_max(amax_ptr + entry, tl.max(tl.max(magnitude, axis=2), axis=1), mask=rows < M)
            tl.atomic_add(sat_ptr + entry, saturated, mask=rows < M)
    else:  # dynamic scaling's first pass: this tile's amax, in its own slot
        tl.store(amax_ptr + tl.program_id(0) * tl.num_programs(1) + tl.program_id(1), tl.max(magnitude))


def _launch(grad, cos, sin, positions, outputs, scale, dtype: torch.dtype, rotate: bool, recorded=None,
            tile: Tile = ROPE_GRAD_TILE):  # fmt: skip
    """Runs the kernel over `grad` (batch, heads, seq, head_dim), tiled by `tile`: casting into `outputs` (an (M, F)
    and an (F, M) FP8 tensor) and recording into `recorded` (a site's amax and saturation row buffers) if given;
    without `outputs`, returns the amax per tile."""
    if grad.dim() != 4 or not grad.is_cuda:
        raise ValueError("the RoPE gradient kernel takes a 4-D (batch, heads, seq, head_dim) CUDA tensor")
    batch, heads, seq, head_dim = grad.shape
    m, f = batch * seq, heads * head_dim
    block_d = triton.next_power_of_2(head_dim)
    # The tile's channels (block_f) in whole heads.
    block_h = min(max(1, tile.block_f // block_d), triton.next_power_of_2(heads))
    grid = (triton.cdiv(m, tile.block_m), triton.cdiv(heads, block_h))
    cast = outputs is not None
    tile_amax = None if cast else torch.empty(grid, device=grad.device, dtype=torch.float32)
    unused = grad  # the pointer a launch passes for what it does not read or write
    amax, saturated = recorded if recorded is not None else (tile_amax if tile_amax is not None else unused, unused)
    pos = positions if positions is not None else unused
    pos_stride = positions.stride(0) if positions is not None and positions.shape[0] > 1 else 0
    wrap_triton(_rope_grad_kernel)[grid](
        grad, cos, sin, pos, *(outputs if cast else (unused, unused)), scale if cast else unused, amax, saturated,
        m, f, seq, heads, head_dim, *grad.stride(), pos_stride, amax.numel(), LIMIT=fp8_max(dtype), ROTATE=rotate,
        POSITIONS=positions is not None, CAST=cast, RECORD=recorded is not None, BLOCK_M=tile.block_m,
        BLOCK_H=block_h, BLOCK_D=block_d, num_warps=tile.warps,
    )  # fmt: skip
    return tile_amax


@triton_op("cs336_fp8::rope_grad_amax", mutates_args={})
def rope_grad_amax(
    grad: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor | None, rotate: bool
) -> torch.Tensor:
    return _launch(grad, cos, sin, positions, None, None, E5M2, rotate).amax().reshape(1)


@triton_op("cs336_fp8::rope_grad_cast", mutates_args={"amax_rows", "saturated_rows"})
def rope_grad_cast(
    grad: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor | None,
    scale: torch.Tensor,
    dtype: torch.dtype,
    rotate: bool,
    record: bool,
    amax_rows: torch.Tensor,
    saturated_rows: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    batch, heads, seq, head_dim = grad.shape
    m, f = batch * seq, heads * head_dim
    outputs = (torch.empty(m, f, device=grad.device, dtype=dtype), torch.empty(f, m, device=grad.device, dtype=dtype))
    _launch(grad, cos, sin, positions, outputs, scale, dtype, rotate, (amax_rows, saturated_rows) if record else None)
    return outputs
