"""The q/k/v gradients' FP8 producer as a Triton kernel (CUDA): RoPE's backward, the FP8 cast, its transposed copy and
the recordings of delayed scaling in one pass over attention's gradient.

Unfused, RoPE's backward writes q's and k's gradients in BF16 in attention's (batch, heads, seq, head_dim) layout and
the projection's cast reads them back token-major, reducing each token's row across the heads: inductor fused the
two into one kernel that ran at a fraction of the memory bandwidth, then a separate kernel wrote the transposed copy
(INDEX.md: 2026-11-25-kernel-profiles-h200). Here each program reads a tile of tokens x channels
of the gradient (any strides but a contiguous last axis), rotates it back, and writes it in FP8 row-major and
transposed; with delayed scaling each tile's amax and saturation count go straight into the site's own row buffers
(tiles.record_tile), with no kernel of their own. One launch casts q's, k's and v's gradients (the grid's third axis).
The operations, their signatures and numerics are rope_reference.py's; tests compare the two on the GPU. They are
torch custom ops whose kernels torch.compile traces (torch.library.triton_op), so a compiled graph keeps them
(fullgraph) and inductor launches the kernels from its own wrapper.

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


@triton.jit
def _rope_grad_qkv_kernel(
    gq_ptr, gk_ptr, gv_ptr, cos_ptr, sin_ptr, pos_ptr, out_ptr, second_q_ptr, second_k_ptr, second_v_ptr, scales_ptr,
    joint_scales_ptr, amax_q_ptr, sat_q_ptr, amax_k_ptr, sat_k_ptr, amax_v_ptr, sat_v_ptr, M, seq, pos_stride_b,
    F_q, stride_qb, stride_qh, stride_qs, rows_q, F_k, stride_kb, stride_kh, stride_ks, rows_k,
    F_v, stride_vb, stride_vh, stride_vs, rows_v,
    HEAD_DIM: tl.constexpr, LIMIT: tl.constexpr, POSITIONS: tl.constexpr, TRANSPOSE: tl.constexpr,
    KEEP_Q: tl.constexpr, KEEP_K: tl.constexpr, KEEP_V: tl.constexpr, RECORD: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_F: tl.constexpr,
):  # fmt: skip
    # One launch for the three gradients: axis 2 of the grid picks q's, k's or v's, of which this program casts one
    # tile as _rope_grad_kernel does (by element i of `scales` and `joint_scales`, into the joint matrix's columns
    # after those of the gradients before it). Axis 1 spans the widest gradient; a narrower one's (k's and v's with
    # GQA) tiles beyond its width do nothing. One call per gradient rather than one call on arguments picked by the
    # branch: Triton makes an integer argument equal to 1 a constant, and a branch may not give a variable two types.
    which, first_col, width = tl.program_id(2), tl.program_id(1) * BLOCK_F, F_q + F_k + F_v
    if (which == 0) & (first_col < F_q):
        _rope_grad_kernel(
            gq_ptr, cos_ptr, sin_ptr, pos_ptr, out_ptr, second_q_ptr, scales_ptr, joint_scales_ptr, amax_q_ptr,
            sat_q_ptr, M, F_q, seq, stride_qb, stride_qh, stride_qs, pos_stride_b, rows_q, width, 0, HEAD_DIM, LIMIT,
            ROTATE=True, POSITIONS=POSITIONS, CAST=True, TRANSPOSE=TRANSPOSE, KEEP_BF16=KEEP_Q, RECORD=RECORD,
            BLOCK_M=BLOCK_M, BLOCK_F=BLOCK_F,
        )  # fmt: skip
    elif (which == 1) & (first_col < F_k):
        _rope_grad_kernel(
            gk_ptr, cos_ptr, sin_ptr, pos_ptr, out_ptr, second_k_ptr, scales_ptr + 1, joint_scales_ptr + 1,
            amax_k_ptr, sat_k_ptr, M, F_k, seq, stride_kb, stride_kh, stride_ks, pos_stride_b, rows_k, width, F_q,
            HEAD_DIM, LIMIT, ROTATE=True, POSITIONS=POSITIONS, CAST=True, TRANSPOSE=TRANSPOSE, KEEP_BF16=KEEP_K,
            RECORD=RECORD, BLOCK_M=BLOCK_M, BLOCK_F=BLOCK_F,
        )  # fmt: skip
    elif (which == 2) & (first_col < F_v):
        _rope_grad_kernel(
            gv_ptr, cos_ptr, sin_ptr, pos_ptr, out_ptr, second_v_ptr, scales_ptr + 2, joint_scales_ptr + 2,
            amax_v_ptr, sat_v_ptr, M, F_v, seq, stride_vb, stride_vh, stride_vs, pos_stride_b, rows_v, width,
            F_q + F_k, HEAD_DIM, LIMIT, ROTATE=False, POSITIONS=POSITIONS, CAST=True, TRANSPOSE=TRANSPOSE,
            KEEP_BF16=KEEP_V, RECORD=RECORD, BLOCK_M=BLOCK_M, BLOCK_F=BLOCK_F,
        )  # fmt: skip


def _layout(grad: torch.Tensor) -> tuple[torch.Tensor, int, list[int]]:
    """(grad, with its last axis contiguous; its width heads * head_dim; its strides along batch, heads and seq) of a
    (batch, heads, seq, head_dim) gradient, as the kernels take it."""
    if grad.dim() != 4 or not grad.is_cuda:
        raise ValueError("the RoPE gradient kernels take 4-D (batch, heads, seq, head_dim) CUDA tensors")
    if grad.stride(-1) != 1:
        grad = grad.contiguous()
    return grad, _width(grad), list(grad.stride()[:3])


def _width(grad: torch.Tensor) -> int:
    """Channels of a (batch, heads, seq, head_dim) gradient: heads * head_dim."""
    return grad.shape[1] * grad.shape[3]


def _positions(positions: torch.Tensor | None, unused: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The kernels' positions pointer (`unused` for none: never read) and its batch stride (0 if one row for all)."""
    if positions is None:
        return unused, 0
    return positions, positions.stride(0) if positions.shape[0] > 1 else 0


@triton_op("cs336_fp8::rope_grad_amax", mutates_args={})
def rope_grad_amax(
    grad: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor | None, rotate: bool
) -> torch.Tensor:
    grad, f, strides = _layout(grad)
    batch, _, seq, head_dim = grad.shape
    tile = ROPE_GRAD_TILE  # read at each launch, as the other kernels' tiles are (the store guard test sweeps them)
    grid = tile.grid(batch * seq, f)
    tile_amax = torch.empty(grid, device=grad.device, dtype=torch.float32)
    pos, pos_stride = _positions(positions, grad)
    # The pointers this pass neither reads nor writes (outputs, scales, saturation counts) are given grad.
    wrap_triton(_rope_grad_kernel)[grid](
        grad, cos, sin, pos, grad, grad, grad, grad, tile_amax, grad, batch * seq, f, seq, *strides, pos_stride,
        tile_amax.numel(), f, 0, HEAD_DIM=head_dim, LIMIT=fp8_max(E5M2), ROTATE=rotate,
        POSITIONS=positions is not None, CAST=False, TRANSPOSE=False, KEEP_BF16=False, RECORD=False,
        **tile.launch_options(),
    )  # fmt: skip
    return tile_amax.amax().reshape(1)


# One launch for the three gradients, so that torch.compile traces the op and inductor launches the kernel from its
# own wrapper: as an opaque custom op, three launches from Python cost host time in every step that is not a CUDA
# graph (INDEX.md: 2026-11-27-nongraph-host-time), and traced, three launches into one matrix became three functional
# mutations, between which inductor copied the matrix. It returns a fixed tuple and mutates single tensors:
# functionalization refused a list returned beside mutated arguments.
@triton_op(
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
    layouts = [_layout(grad) for grad in (grad_q, grad_k, grad_v)]
    grads = [grad for grad, _, _ in layouts]
    batch, _, seq, head_dim = grad_q.shape
    if any((grad.shape[0], *grad.shape[2:], grad.dtype) != (batch, seq, head_dim, grad_q.dtype) for grad in grads):
        raise ValueError("q's, k's and v's gradients must share their batch, seq, head_dim and dtype")
    joint, seconds = _outputs(grads, dtype, keep_bf16, transposed)
    # What the launch neither reads nor writes (the row buffers without `record`, an empty second output) is given
    # q's gradient in its place.
    unused = grads[0]
    rows = (amax_q, saturated_q, amax_k, saturated_k, amax_v, saturated_v) if record else (unused,) * 6
    per_grad = []  # each gradient's F, stride_b, stride_h, stride_s and recorded rows
    for (_, width, strides), amax in zip(layouts, rows[::2], strict=True):
        per_grad += [width, *strides, amax.numel()]
    pos, pos_stride = _positions(positions, unused)
    tile = ROPE_GRAD_TILE  # read at each launch, as the other kernels' tiles are (the store guard test sweeps them)
    grid = (*tile.grid(batch * seq, max(width for _, width, _ in layouts)), 3)
    wrap_triton(_rope_grad_qkv_kernel)[grid](
        *grads, cos, sin, pos, joint, *(second if second.numel() else unused for second in seconds), scales,
        joint_scales, *rows, batch * seq, seq, pos_stride, *per_grad, HEAD_DIM=head_dim, LIMIT=fp8_max(dtype),
        POSITIONS=positions is not None, TRANSPOSE=transposed, KEEP_Q=keep_bf16[0], KEEP_K=keep_bf16[1],
        KEEP_V=keep_bf16[2], RECORD=record, **tile.launch_options(),
    )  # fmt: skip
    return joint, *seconds


def _outputs(grads, dtype: torch.dtype, keep_bf16: list[bool], transposed: bool):
    """rope_grad_cast_qkv's outputs, to be written: the joint FP8 matrix and the three second outputs."""
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
