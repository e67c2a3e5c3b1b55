"""The q/k/v gradients' FP8 producer as a Triton kernel (CUDA): RoPE's backward, the FP8 cast, its transposed copy and
the per-row recordings of delayed scaling in one pass over attention's gradient.

Unfused, RoPE's backward writes q's and k's gradients in BF16 in attention's (batch, heads, seq, head_dim) layout and
the projection's cast reads them back token-major, reducing each token's row across the heads: inductor fused the
two into one kernel that ran at a fraction of the memory bandwidth, then a separate kernel wrote the transposed copy
(benchmarks/results/2026-11-25-kernel-profiles-h200/README.md). Here each program reads a tile of tokens x channels
of the gradient (any strides), rotates it back, and writes it in FP8 row-major and transposed; each row's amax and
saturation count go to the program's own slot, reduced by torch (no atomics). The operations, their signatures and
numerics are rope_reference.py's; tests compare the two on the GPU. They are torch custom ops
(torch.library.triton_op), so torch.compile keeps them in its graph (fullgraph).

Imported only on CUDA machines: triton ships with torch's Linux CUDA wheels.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from cs336_basics.precision.fused.scaling import E5M2, fp8_max
from cs336_basics.precision.fused.tiles import ROPE_GRAD_TILE, tile_offsets


@triton.jit
def _rope_grad_kernel(
    g_ptr, cos_ptr, sin_ptr, pos_ptr, out_ptr, out_t_ptr, scale_ptr, amax_ptr, sat_ptr,
    M, F, seq, head_dim, stride_b, stride_h, stride_s, stride_d, pos_stride_b,
    LIMIT: tl.constexpr, ROTATE: tl.constexpr, POSITIONS: tl.constexpr, CAST: tl.constexpr, AMAX: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_F: tl.constexpr,
):  # fmt: skip
    # Rows are tokens (batch * seq), columns channels (heads * head_dim) of the token-major gradient.
    offs, offs_t, mask = tile_offsets(M, F, BLOCK_M, BLOCK_F)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    batch, pos = rows // seq, rows % seq
    head, dim = cols // head_dim, cols % head_dim
    token = batch.to(tl.int64)[:, None] * stride_b + pos[:, None].to(tl.int64) * stride_s
    at = g_ptr + token + head[None, :].to(tl.int64) * stride_h
    g = tl.load(at + dim[None, :] * stride_d, mask=mask, other=0.0).to(tl.float32)
    if ROTATE:
        # Channel pairs (2i, 2i+1) were rotated by pos * theta_i: rotate back, pairing each channel with its partner.
        partner = tl.load(at + (dim ^ 1)[None, :] * stride_d, mask=mask, other=0.0).to(tl.float32)
        if POSITIONS:
            pos = tl.load(pos_ptr + batch * pos_stride_b + pos, mask=rows < M, other=0)
        angle = pos[:, None].to(tl.int64) * (head_dim // 2) + (dim // 2)[None, :]
        cos = tl.load(cos_ptr + angle, mask=mask, other=0.0)
        sin = tl.load(sin_ptr + angle, mask=mask, other=0.0)
        sign = tl.where(dim % 2 == 0, 1.0, -1.0)[None, :]
        # Rounded to BF16 as the unfused backward writes it.
        g = (g * cos + sign * partner * sin).to(tl.bfloat16).to(tl.float32)
    magnitude = tl.abs(g)
    slot = tl.program_id(1) * M + rows
    if CAST:
        scale = tl.load(scale_ptr)
        y = tl.minimum(tl.maximum(g * scale, -LIMIT), LIMIT).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + offs, y, mask=mask)
        tl.store(out_t_ptr + offs_t, y, mask=mask)
        if AMAX:
            tl.store(sat_ptr + slot, tl.sum((magnitude * scale > LIMIT).to(tl.int32), axis=1), mask=rows < M)
    if AMAX:
        tl.store(amax_ptr + slot, tl.max(magnitude, axis=1), mask=rows < M)


def _launch(grad, cos, sin, positions, outputs, scale, dtype: torch.dtype, record: bool, rotate: bool):
    """Runs the kernel over `grad` (batch, heads, seq, head_dim): casting into `outputs` (an (M, F) and an (F, M) FP8
    tensor) when given, recording when `record`. Returns (amax, saturated) per token row, or empty tensors."""
    if grad.dim() != 4 or not grad.is_cuda:
        raise ValueError("the RoPE gradient kernel takes a 4-D (batch, heads, seq, head_dim) CUDA tensor")
    batch, heads, seq, head_dim = grad.shape
    m, f = batch * seq, heads * head_dim
    grid = ROPE_GRAD_TILE.grid(m, f)
    slots = (grid[1], m) if record else (0,)
    amax_slots = torch.empty(slots, device=grad.device, dtype=torch.float32)
    saturated_slots = torch.empty(slots, device=grad.device, dtype=torch.int32)
    cast = outputs is not None
    unused = grad  # the pointer a launch passes for what it does not read or write
    pos = positions if positions is not None else unused
    pos_stride = positions.stride(0) if positions is not None and positions.shape[0] > 1 else 0
    wrap_triton(_rope_grad_kernel)[grid](
        grad, cos, sin, pos, *(outputs if cast else (unused, unused)), scale if cast else unused, amax_slots,
        saturated_slots, m, f, seq, head_dim, *grad.stride(), pos_stride, LIMIT=fp8_max(dtype), ROTATE=rotate,
        POSITIONS=positions is not None, CAST=cast, AMAX=record, **ROPE_GRAD_TILE.launch_options(),
    )  # fmt: skip
    if not record:
        return amax_slots, saturated_slots
    return amax_slots.amax(dim=0), saturated_slots.sum(dim=0, dtype=torch.int32)


@triton_op("cs336_fp8::rope_grad_amax", mutates_args={})
def rope_grad_amax(
    grad: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor | None, rotate: bool
) -> torch.Tensor:
    return _launch(grad, cos, sin, positions, None, None, E5M2, True, rotate)[0].amax().reshape(1)


@triton_op("cs336_fp8::rope_grad_cast", mutates_args={})
def rope_grad_cast(
    grad: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor | None,
    scale: torch.Tensor,
    dtype: torch.dtype,
    record: bool,
    rotate: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    batch, heads, seq, head_dim = grad.shape
    m, f = batch * seq, heads * head_dim
    outputs = (torch.empty(m, f, device=grad.device, dtype=dtype), torch.empty(f, m, device=grad.device, dtype=dtype))
    return (*outputs, *_launch(grad, cos, sin, positions, outputs, scale, dtype, record, rotate))
