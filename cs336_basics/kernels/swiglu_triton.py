"""SwiGLU's FP8 producers as Triton kernels (CUDA): the SwiGLU output g and the gradients dh1, dh3 (side by side) are
written straight in FP8, row-major and transposed, by the kernel that computes them, never in BF16.

Unfused, each of these tensors is written in BF16, read back for its amax, read again to be cast and written again
transposed: on the 366m shape inductor's kernels for them took more time than the BF16 SwiGLU itself
(INDEX.md: 2026-11-22-fused-fp8-exploration-h200). Here:
- dynamic scaling: one pass reads the inputs for the amax (one per tile, reduced by torch), a second reads them
  again and writes the FP8 tensor and its transpose;
- delayed scaling: one pass, which also records the amax and counts the saturated values for later steps.
The operations, their signatures and their numerics are swiglu_reference.py's; tests compare the two on the GPU.
They are torch custom ops (torch.library.triton_op), so torch.compile keeps them in its graph (fullgraph).

Imported only on CUDA machines: triton ships with torch's Linux CUDA wheels.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from cs336_basics.kernels.fp8_format import fp8_max
from cs336_basics.kernels.tiles import (
    SWIGLU_GRAD_TILE,
    SWIGLU_TILE,
    Tile,
    record_tile,
    saturating_cast,
    tile_offsets,
)


@triton.jit
def _round_bf16(x):
    return x.to(tl.bfloat16).to(tl.float32)


@triton.jit
def _produce(value, k, scale_ptr, joint_scale_ptr, out_ptr, out_t_ptr, amax_ptr, sat_ptr, recorded_rows, offs, offs_t,
             mask, LIMIT: tl.constexpr, CAST: tl.constexpr, RECORD: tl.constexpr, TRANSPOSE: tl.constexpr):  # fmt: skip
    """Tensor k of a producer. CAST: cast it and store it row-major by its joint scale (its scale where it has no
    joint GEMM: the kernel gets the same pointer twice), with its transpose by its own scale if TRANSPOSE, and with
    RECORD file the tile's amax and its saturation count against its own scale into the site's row buffers
    (record_tile). Otherwise (dynamic scaling's first pass) write the tile's amax to this program's slot of row k;
    torch reduces the slots (atomics on one address from every program would serialise)."""
    magnitude = tl.abs(value)
    if CAST:
        scale = tl.load(scale_ptr + k)
        y = saturating_cast(value, tl.load(joint_scale_ptr + k), LIMIT, out_ptr.dtype.element_ty)
        tl.store(out_ptr + offs, y, mask=mask)
        if TRANSPOSE:
            tl.store(out_t_ptr + offs_t, saturating_cast(value, scale, LIMIT, out_t_ptr.dtype.element_ty), mask=mask)
        if RECORD:
            record_tile(magnitude, scale, amax_ptr, sat_ptr, recorded_rows, LIMIT)
    else:
        programs = tl.num_programs(0) * tl.num_programs(1)
        tl.store(amax_ptr + k * programs + tl.program_id(1) * tl.num_programs(0) + tl.program_id(0), tl.max(magnitude))


@triton.jit
def _swiglu_kernel(
    h1_ptr, h3_ptr, g_ptr, g_t_ptr, scale_ptr, joint_scale_ptr, amax_ptr, sat_ptr, recorded_rows, M, F,
    LIMIT: tl.constexpr, CAST: tl.constexpr, RECORD: tl.constexpr, TRANSPOSE: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_F: tl.constexpr,
):  # fmt: skip
    offs, offs_t, mask = tile_offsets(M, F, BLOCK_M, BLOCK_F)
    a = tl.load(h1_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(h3_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    # silu as torch computes it, each result rounded to BF16 where the BF16 module rounds it.
    g = _round_bf16(_round_bf16(a / (1.0 + tl.exp(-a))) * b)
    _produce(g, 0, scale_ptr, joint_scale_ptr, g_ptr, g_t_ptr, amax_ptr, sat_ptr, recorded_rows, offs, offs_t, mask,
             LIMIT, CAST, RECORD, TRANSPOSE)  # fmt: skip


@triton.jit
def _swiglu_grad_kernel(
    dg_ptr, h1_ptr, h3_ptr, dh_ptr, dh1_t_ptr, dh3_t_ptr, scale_ptr, joint_scale_ptr, amax1_ptr, sat1_ptr,
    recorded_rows1, amax3_ptr, sat3_ptr, recorded_rows3, M, F,
    LIMIT: tl.constexpr, CAST: tl.constexpr, RECORD: tl.constexpr, TRANSPOSE: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_F: tl.constexpr,
):  # fmt: skip
    offs, offs_t, mask = tile_offsets(M, F, BLOCK_M, BLOCK_F)
    # dh1 and dh3 side by side, the columns of one (M, 2F) matrix at dh_ptr; their transposes apart.
    out_offs = offs + (offs // F) * F
    dg = tl.load(dg_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    a = tl.load(h1_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(h3_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    # Autograd of silu(h1) * h3 in BF16: dh3 = dg * silu(h1); dh1 = silu'(h1) * (dg * h3), torch's silu_backward.
    sig = 1.0 / (1.0 + tl.exp(-a))
    dh1 = _round_bf16(_round_bf16(dg * b) * sig * (1.0 + a * (1.0 - sig)))
    dh3 = _round_bf16(dg * _round_bf16(a * sig))
    _produce(dh1, 0, scale_ptr, joint_scale_ptr, dh_ptr, dh1_t_ptr, amax1_ptr, sat1_ptr, recorded_rows1, out_offs,
             offs_t, mask, LIMIT, CAST, RECORD, TRANSPOSE)  # fmt: skip
    if not CAST:  # dynamic scaling's first pass: both tensors' tile amaxes go to one slot tensor (_amax_pass)
        amax3_ptr = amax1_ptr
    _produce(dh3, 1, scale_ptr, joint_scale_ptr, dh_ptr + F, dh3_t_ptr, amax3_ptr, sat3_ptr, recorded_rows3, out_offs,
             offs_t, mask, LIMIT, CAST, RECORD, TRANSPOSE)  # fmt: skip


def _check(*tensors: torch.Tensor) -> tuple[int, int]:
    shape = tensors[0].shape
    for t in tensors:
        if t.dim() != 2 or t.shape != shape or not t.is_contiguous() or not t.is_cuda:
            raise ValueError("SwiGLU FP8 kernels take contiguous 2-D CUDA tensors of one shape")
    return shape


def _amax_pass(kernel, tile: Tile, inputs, n: int) -> torch.Tensor:
    """Dynamic scaling's first pass of `kernel` over `inputs` ((M, F) tensors): the amaxes (n,) of its n produced
    tensors."""
    m, f = _check(*inputs)
    grid = tile.grid(m, f)
    slots = torch.empty(n, grid[0] * grid[1], device=inputs[0].device, dtype=torch.float32)
    unused = inputs[0]  # the pointer a launch passes for what it does not touch
    # The slots go in as the first tensor's amax pointer only. Passed as both tensors' amax pointers (two arguments the
    # kernel writes, one tensor), the compiled block's input gradient came out wrong in a GPU test run, as if
    # torch.compile's functionalized launch had written each argument to a copy of its own and kept one.
    records = [slots, unused, 1] + [unused, unused, 1] * (n - 1)
    wrap_triton(kernel)[grid](
        *inputs, *[unused] * (1 + n), unused, unused, *records, m, f,
        LIMIT=1.0, CAST=False, RECORD=False, TRANSPOSE=False, **tile.launch_options(),
    )  # fmt: skip
    return slots.amax(dim=1)


def _cast_pass(kernel, tile: Tile, inputs, outputs, scales, joint_scales, dtype: torch.dtype, record: bool, recorded,
               transposed: bool) -> None:  # fmt: skip
    """Runs `kernel` over `inputs`, casting its n produced tensors into `outputs` (one row-major FP8 matrix, the n
    (M, F) tensors side by side, by `joint_scales`; then each one's (F, M) FP8 transpose by `scales`, not written
    unless `transposed`), and with `record` filing each tensor's amax and saturation count (against `scales`) into its
    (amax, saturated) row buffers in `recorded`."""
    m, f = _check(*inputs)
    if not record:  # the stand-ins callers pass may be empty: the launch gets an input's pointer in their place
        recorded = [(inputs[0], inputs[0])] * len(recorded)
    rows = [arg for amax, saturated in recorded for arg in (amax, saturated, amax.numel())]
    wrap_triton(kernel)[tile.grid(m, f)](
        *inputs, *outputs, scales, joint_scales, *rows, m, f,
        LIMIT=fp8_max(dtype), CAST=True, RECORD=record, TRANSPOSE=transposed, **tile.launch_options(),
    )  # fmt: skip


def _fp8_pair(m: int, f: int, like: torch.Tensor, dtype: torch.dtype, transposed: bool) -> list[torch.Tensor]:
    """An (M, F) FP8 tensor and its (F, M) transpose, to be written (an empty tensor in its place if not
    `transposed`)."""
    shape_t = (f, m) if transposed else (0,)
    return [torch.empty(m, f, device=like.device, dtype=dtype), torch.empty(shape_t, device=like.device, dtype=dtype)]


@triton_op("cs336_fp8::swiglu_amax", mutates_args={})
def swiglu_amax(h1: torch.Tensor, h3: torch.Tensor) -> torch.Tensor:
    return _amax_pass(_swiglu_kernel, SWIGLU_TILE, (h1, h3), 1)


@triton_op("cs336_fp8::swiglu_cast", mutates_args={"amax_rows", "saturated_rows"})
def swiglu_cast(
    h1: torch.Tensor,
    h3: torch.Tensor,
    scale: torch.Tensor,
    dtype: torch.dtype,
    record: bool,
    amax_rows: torch.Tensor,
    saturated_rows: torch.Tensor,
    transposed: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    g = _fp8_pair(*h1.shape, h1, dtype, transposed)
    _cast_pass(_swiglu_kernel, SWIGLU_TILE, (h1, h3), g, scale, scale, dtype, record, [(amax_rows, saturated_rows)],
               transposed)  # fmt: skip
    return g[0], g[1]


@triton_op("cs336_fp8::swiglu_grad_amax", mutates_args={})
def swiglu_grad_amax(dg: torch.Tensor, h1: torch.Tensor, h3: torch.Tensor) -> torch.Tensor:
    return _amax_pass(_swiglu_grad_kernel, SWIGLU_GRAD_TILE, (dg, h1, h3), 2)


@triton_op(
    "cs336_fp8::swiglu_grad_cast", mutates_args={"amax_rows1", "saturated_rows1", "amax_rows3", "saturated_rows3"}
)
def swiglu_grad_cast(
    dg: torch.Tensor,
    h1: torch.Tensor,
    h3: torch.Tensor,
    scales: torch.Tensor,
    joint_scales: torch.Tensor,
    dtype: torch.dtype,
    record: bool,
    amax_rows1: torch.Tensor,
    saturated_rows1: torch.Tensor,
    amax_rows3: torch.Tensor,
    saturated_rows3: torch.Tensor,
    transposed: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    m, f = dg.shape
    joint = torch.empty(m, 2 * f, device=dg.device, dtype=dtype)
    dh1_t, dh3_t = (torch.empty((f, m) if transposed else (0,), device=dg.device, dtype=dtype) for _ in range(2))
    recorded = [(amax_rows1, saturated_rows1), (amax_rows3, saturated_rows3)]
    _cast_pass(_swiglu_grad_kernel, SWIGLU_GRAD_TILE, (dg, h1, h3), [joint, dh1_t, dh3_t], scales, joint_scales, dtype,
               record, recorded, transposed)  # fmt: skip
    return joint, dh1_t, dh3_t
