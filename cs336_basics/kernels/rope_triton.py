"""The q/k/v gradients' FP8 producer as a Triton kernel (CUDA): RoPE's backward, the FP8 cast, its transposed copy and
the recordings of delayed scaling in one pass over attention's gradient.

Unfused, RoPE's backward writes q's and k's gradients in BF16 in attention's (batch, heads, seq, head_dim) layout and
the projection's cast reads them back token-major, reducing each token's row across the heads: inductor fused the
two into one kernel that ran at a fraction of the memory bandwidth, then a separate kernel wrote the transposed copy
(INDEX.md: 2026-11-25-kernel-profiles-h200). Here each program reads a tile of tokens x channels
of the gradient (any strides but a contiguous last axis), rotates it back, and writes it in FP8 row-major and
transposed; with delayed scaling each tile's amax and saturation count go straight into the site's own row buffers
(tiles.record_tile), with no kernel of their own.
The operations, their signatures and numerics are rope_reference.py's; tests compare the two on the GPU. They are
torch custom ops, so torch.compile keeps them in its graph (fullgraph): the amax pass a triton_op, the cast an opaque
custom op (its comment says why).

Imported only on CUDA machines: triton ships with torch's Linux CUDA wheels.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from cs336_basics.kernels.fp8_format import E5M2, fp8_max
from cs336_basics.kernels.rope_reference import check_second_outputs
from cs336_basics.kernels.tiles import ROPE_GRAD_TILE, record_tile, saturating_cast


@triton.jit
def _rope_grad_kernel(
    g_ptr, cos_ptr, sin_ptr, pos_ptr, out_ptr, out_t_ptr, scale_ptr, joint_scale_ptr, amax_ptr, sat_ptr,
    M, F, seq, stride_b, stride_h, stride_s, pos_stride_b, recorded_rows, out_stride, out_col,
    HEAD_DIM: tl.constexpr, LIMIT: tl.constexpr, ROTATE: tl.constexpr, POSITIONS: tl.constexpr, CAST: tl.constexpr,
    TRANSPOSE: tl.constexpr, KEEP_BF16: tl.constexpr, RECORD: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_F: tl.constexpr,
):  # fmt: skip
    # A tile is BLOCK_M tokens (rows of the token-major gradient: batch * seq) x BLOCK_F channels (heads * head_dim),
    # a plain 2-D tile like the transpose kernel's, so that the loads (contiguous within a head) and both stores
    # coalesce. A 3-D tile (tokens x heads x channels) wrote its transposed copy one byte at a time.
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    row_mask = rows < M
    mask = row_mask[:, None] & (cols < F)[None, :]
    batch, pos = rows // seq, rows % seq
    token = batch.to(tl.int64) * stride_b + pos.to(tl.int64) * stride_s
    channel = (cols // HEAD_DIM) * stride_h + cols % HEAD_DIM  # the last axis is contiguous (checked at launch)
    g = tl.load(g_ptr + token[:, None] + channel[None, :], mask=mask, other=0.0).to(tl.float32)
    if ROTATE:
        # Channel pairs (2i, 2i+1) of a head were rotated by pos * theta_i: rotate them back.
        if POSITIONS:
            pos = tl.load(pos_ptr + batch * pos_stride_b + pos, mask=row_mask, other=0)
        pairs = tl.program_id(1) * (BLOCK_F // 2) + tl.arange(0, BLOCK_F // 2)
        angle = pos.to(tl.int64)[:, None] * (HEAD_DIM // 2) + (pairs % (HEAD_DIM // 2))[None, :]
        angle_mask = row_mask[:, None] & (pairs * 2 < F)[None, :]
        cos = tl.load(cos_ptr + angle, mask=angle_mask, other=0.0)
        sin = tl.load(sin_ptr + angle, mask=angle_mask, other=0.0)
        g1, g2 = tl.split(tl.reshape(g, (BLOCK_M, BLOCK_F // 2, 2)))
        g = tl.reshape(tl.join(g1 * cos + g2 * sin, g2 * cos - g1 * sin), (BLOCK_M, BLOCK_F))
        # Rounded to BF16 as the unfused backward writes it.
        g = g.to(tl.bfloat16).to(tl.float32)
    magnitude = tl.abs(g)
    if CAST:
        scale = tl.load(scale_ptr)
        # The row-major output: the columns from out_col of the three gradients' joint matrix (row stride
        # out_stride), cast by the joint input-gradient GEMM's scale.
        y = saturating_cast(g, tl.load(joint_scale_ptr), LIMIT, out_ptr.dtype.element_ty)
        offs = rows[:, None].to(tl.int64) * F + cols[None, :]
        tl.store(out_ptr + rows[:, None].to(tl.int64) * out_stride + out_col + cols[None, :], y, mask=mask)
        if TRANSPOSE:  # for the weight gradient's GEMM, by the site's own scale
            y_t = saturating_cast(g, scale, LIMIT, out_t_ptr.dtype.element_ty)
            tl.store(out_t_ptr + cols[None, :].to(tl.int64) * M + rows[:, None], y_t, mask=mask)
        if KEEP_BF16:  # the rotated gradient itself, in the second output's place: for a frozen base's adapters
            tl.store(out_t_ptr + offs, g.to(out_t_ptr.dtype.element_ty), mask=mask)
        if RECORD:
            record_tile(magnitude, scale, amax_ptr, sat_ptr, recorded_rows, LIMIT)
    else:  # dynamic scaling's first pass: this tile's amax, in its own slot
        tl.store(amax_ptr + tl.program_id(0) * tl.num_programs(1) + tl.program_id(1), tl.max(magnitude))


def _launch(kernel, grad, cos, sin, positions, outputs, scales, dtype: torch.dtype, rotate: bool, recorded=None,
            keep_bf16: bool = False, out_col: int = 0):  # fmt: skip
    """Runs the kernel over `grad` (batch, heads, seq, head_dim), tiled by ROPE_GRAD_TILE: casting into `outputs` (a
    wider row-major FP8 tensor written from column `out_col` on, by the second of `scales` (the site's own scale, the
    joint GEMM's), and a second tensor: the (F, M) FP8 transpose by the first; with `keep_bf16` the (M, F) rotated
    gradient in grad's dtype instead; or None) and recording into `recorded` (a site's amax and saturation row
    buffers, counted against the site's own scale) if given; without `outputs`, returns the amax per tile. `kernel`:
    _rope_grad_kernel, wrapped by wrap_triton inside a triton_op (which torch.compile traces), launched as it is inside
    the opaque custom op: there wrap_triton's eager path (a higher-order op dispatched per launch) cost about a
    millisecond of host time per launch, most of a non-graph FP8 step's host time at 366m
    (INDEX.md: 2026-11-27-nongraph-host-time)."""
    if grad.dim() != 4 or not grad.is_cuda:
        raise ValueError("the RoPE gradient kernel takes a 4-D (batch, heads, seq, head_dim) CUDA tensor")
    if grad.stride(-1) != 1:
        grad = grad.contiguous()
    batch, heads, seq, head_dim = grad.shape
    m, f = batch * seq, heads * head_dim
    tile = ROPE_GRAD_TILE  # read at each launch, as the other kernels' tiles are (the store guard test sweeps them)
    grid = tile.grid(m, f)
    cast = outputs is not None
    tile_amax = None if cast else torch.empty(grid, device=grad.device, dtype=torch.float32)
    unused = grad  # the pointer a launch passes for what it does not read or write
    amax, saturated = recorded if recorded is not None else (tile_amax if tile_amax is not None else unused, unused)
    pos = positions if positions is not None else unused
    pos_stride = positions.stride(0) if positions is not None and positions.shape[0] > 1 else 0
    stride_b, stride_h, stride_s, _ = grad.stride()
    out, second = outputs if cast else (unused, None)
    out_stride = out.shape[1] if cast else f
    kernel[grid](
        grad, cos, sin, pos, out, unused if second is None else second, *(scales if cast else (unused, unused)), amax,
        saturated,
        m, f, seq, stride_b, stride_h, stride_s, pos_stride, amax.numel(), out_stride, out_col, HEAD_DIM=head_dim,
        LIMIT=fp8_max(dtype), ROTATE=rotate, POSITIONS=positions is not None, CAST=cast,
        TRANSPOSE=second is not None and not keep_bf16, KEEP_BF16=keep_bf16, RECORD=recorded is not None,
        **tile.launch_options(),
    )  # fmt: skip
    return tile_amax


@triton_op("cs336_fp8::rope_grad_amax", mutates_args={})
def rope_grad_amax(
    grad: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor | None, rotate: bool
) -> torch.Tensor:
    return (
        _launch(wrap_triton(_rope_grad_kernel), grad, cos, sin, positions, None, None, E5M2, rotate).amax().reshape(1)
    )


# An opaque custom op, not a triton_op: traced, its three launches into one matrix became three functional mutations,
# and inductor copied the matrix between them. It returns a fixed tuple and mutates single tensors: functionalization
# refused a list returned beside mutated arguments. Nothing traces inside it, so it launches the kernel itself.
@torch.library.custom_op(
    "cs336_fp8::rope_grad_cast_qkv",
    mutates_args={"amax_q", "saturated_q", "amax_k", "saturated_k", "amax_v", "saturated_v"},
)
def rope_grad_cast_qkv(
    grad_q: torch.Tensor,
    grad_k: torch.Tensor,
    grad_v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor | None,
    scales: torch.Tensor,
    joint_scales: torch.Tensor,
    dtype: torch.dtype,
    record: bool,
    keep_bf16: list[bool],
    transposed: bool,
    amax_q: torch.Tensor,
    saturated_q: torch.Tensor,
    amax_k: torch.Tensor,
    saturated_k: torch.Tensor,
    amax_v: torch.Tensor,
    saturated_v: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    check_second_outputs(keep_bf16, transposed)
    grads = (grad_q, grad_k, grad_v)
    recorded = ((amax_q, saturated_q), (amax_k, saturated_k), (amax_v, saturated_v))
    joint, seconds = _outputs(grads, dtype, keep_bf16, transposed)
    start = 0
    for i, grad in enumerate(grads):
        second = seconds[i] if seconds[i].numel() else None
        own_and_joint = (scales[i : i + 1], joint_scales[i : i + 1])
        _launch(_rope_grad_kernel, grad, cos, sin, positions, (joint, second), own_and_joint, dtype, i < 2,
                recorded[i] if record else None, keep_bf16=keep_bf16[i], out_col=start)  # fmt: skip
        start += _width(grad)
    return joint, *seconds


def _outputs(grads, dtype: torch.dtype, keep_bf16: list[bool], transposed: bool):
    """rope_grad_cast_qkv's outputs, to be written (also its fake implementation's, under the fake tensor mode)."""
    batch, _, seq, _ = grads[0].shape
    tokens, device = batch * seq, grads[0].device
    joint = torch.empty((tokens, sum(_width(grad) for grad in grads)), device=device, dtype=dtype)
    seconds = [
        torch.empty((_width(grad), tokens), device=device, dtype=dtype)
        if transposed
        else torch.empty((tokens, _width(grad)) if keep else (0,), device=device, dtype=grad.dtype)
        for grad, keep in zip(grads, keep_bf16, strict=True)
    ]
    return joint, seconds


def _width(grad: torch.Tensor) -> int:
    """Channels of a (batch, heads, seq, head_dim) gradient: heads * head_dim."""
    return grad.shape[1] * grad.shape[3]


@rope_grad_cast_qkv.register_fake
def _(grad_q, grad_k, grad_v, cos, sin, positions, scales, joint_scales, dtype, record, keep_bf16, transposed, *rows):
    joint, seconds = _outputs((grad_q, grad_k, grad_v), dtype, keep_bf16, transposed)
    return joint, *seconds
