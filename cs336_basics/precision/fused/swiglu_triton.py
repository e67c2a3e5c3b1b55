"""SwiGLU's FP8 producers as Triton kernels (CUDA): the SwiGLU output g and the gradients dh1, dh3 are written
straight in FP8, row-major and transposed, by the kernel that computes them, never in BF16.

Unfused, each of these tensors is written in BF16, read back for its amax, read again to be cast and written again
transposed: on the 366m shape inductor's kernels for them took more time than the BF16 SwiGLU itself
(benchmarks/results/2026-11-22-fused-fp8-exploration-h200/). Here:
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

from cs336_basics.precision.fused.scaling import E4M3, E5M2, fp8_max
from cs336_basics.precision.fused.tiles import SWIGLU_GRAD_TILE, SWIGLU_TILE, Tile, tile_offsets

# Each program writes its tile's amax (and saturation count) to its own slot; torch reduces the slots. Atomics on
# one address from every program serialise and cost more than the pass itself.


@triton.jit
def _round_bf16(x):
    return x.to(tl.bfloat16).to(tl.float32)


@triton.jit
def _produce(value, k, scale_ptr, out_ptr, out_t_ptr, amax_ptr, sat_ptr, offs, offs_t, mask,
             LIMIT: tl.constexpr, CAST: tl.constexpr, AMAX: tl.constexpr, TRANSPOSE: tl.constexpr):  # fmt: skip
    """Tensor k of a producer: cast with its scale and store it, with its transpose if TRANSPOSE (CAST); write its
    tile's amax (AMAX) and, when both, the count of its values beyond the scale's range (they saturate at the FP8
    max) to this program's slot of row k."""
    magnitude = tl.abs(value)
    slot = k * tl.num_programs(0) * tl.num_programs(1) + tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
    if CAST:
        scale = tl.load(scale_ptr + k)
        y = tl.minimum(tl.maximum(value * scale, -LIMIT), LIMIT).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + offs, y, mask=mask)
        if TRANSPOSE:
            tl.store(out_t_ptr + offs_t, y, mask=mask)
        if AMAX:
            tl.store(sat_ptr + slot, tl.sum((magnitude * scale > LIMIT).to(tl.int32)))
    if AMAX:
        tl.store(amax_ptr + slot, tl.max(magnitude))


@triton.jit
def _swiglu_kernel(
    h1_ptr, h3_ptr, g_ptr, g_t_ptr, scale_ptr, amax_ptr, sat_ptr, M, F,
    LIMIT: tl.constexpr, CAST: tl.constexpr, AMAX: tl.constexpr, TRANSPOSE: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_F: tl.constexpr,
):  # fmt: skip
    offs, offs_t, mask = tile_offsets(M, F, BLOCK_M, BLOCK_F)
    a = tl.load(h1_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(h3_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    # silu as torch computes it, each result rounded to BF16 where the BF16 module rounds it.
    g = _round_bf16(_round_bf16(a / (1.0 + tl.exp(-a))) * b)
    _produce(g, 0, scale_ptr, g_ptr, g_t_ptr, amax_ptr, sat_ptr, offs, offs_t, mask, LIMIT, CAST, AMAX, TRANSPOSE)


@triton.jit
def _swiglu_grad_kernel(
    dg_ptr, h1_ptr, h3_ptr, dh1_ptr, dh1_t_ptr, dh3_ptr, dh3_t_ptr, scale_ptr, amax_ptr, sat_ptr, M, F,
    LIMIT: tl.constexpr, CAST: tl.constexpr, AMAX: tl.constexpr, TRANSPOSE: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_F: tl.constexpr,
):  # fmt: skip
    offs, offs_t, mask = tile_offsets(M, F, BLOCK_M, BLOCK_F)
    dg = tl.load(dg_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    a = tl.load(h1_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(h3_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    # Autograd of silu(h1) * h3 in BF16: dh3 = dg * silu(h1); dh1 = silu'(h1) * (dg * h3), torch's silu_backward.
    sig = 1.0 / (1.0 + tl.exp(-a))
    dh1 = _round_bf16(_round_bf16(dg * b) * sig * (1.0 + a * (1.0 - sig)))
    dh3 = _round_bf16(dg * _round_bf16(a * sig))
    _produce(dh1, 0, scale_ptr, dh1_ptr, dh1_t_ptr, amax_ptr, sat_ptr, offs, offs_t, mask, LIMIT, CAST, AMAX, TRANSPOSE)
    _produce(dh3, 1, scale_ptr, dh3_ptr, dh3_t_ptr, amax_ptr, sat_ptr, offs, offs_t, mask, LIMIT, CAST, AMAX, TRANSPOSE)


def _check(*tensors: torch.Tensor) -> tuple[int, int]:
    shape = tensors[0].shape
    for t in tensors:
        if t.dim() != 2 or t.shape != shape or not t.is_contiguous() or not t.is_cuda:
            raise ValueError("SwiGLU FP8 kernels take contiguous 2-D CUDA tensors of one shape")
    return shape


def _launch(
    kernel, tile: Tile, inputs, outputs, scales, n: int, dtype: torch.dtype, record: bool, transposed: bool = True
):
    """Runs `kernel`, tiled by `tile`, over `inputs` ((M, F) tensors) for its n produced tensors: casting them into
    `outputs` (pairs of (M, F) and (F, M) FP8 tensors; the second is not written unless `transposed`) when given,
    recording when `record`. Returns (amax, saturated) of shape (n,), or empty tensors when not recording."""
    m, f = _check(*inputs)
    grid = tile.grid(m, f)
    device = inputs[0].device
    slots = (n, grid[0] * grid[1]) if record else (0,)
    amax_slots = torch.empty(slots, device=device, dtype=torch.float32)
    saturated_slots = torch.zeros(slots, device=device, dtype=torch.int32)
    cast = outputs is not None
    unused = inputs[0]  # the pointer a launch passes for what it does not write
    wrap_triton(kernel)[grid](
        *inputs, *(outputs if cast else [unused] * 2 * n), scales if cast else unused, amax_slots, saturated_slots,
        m, f, LIMIT=fp8_max(dtype), CAST=cast, AMAX=record, TRANSPOSE=transposed, **tile.launch_options(),
    )  # fmt: skip
    if not record:
        return amax_slots, saturated_slots
    return amax_slots.amax(dim=1), saturated_slots.sum(dim=1, dtype=torch.int32)


def _fp8_pair(m: int, f: int, like: torch.Tensor, dtype: torch.dtype, transposed: bool) -> list[torch.Tensor]:
    """An (M, F) FP8 tensor and its (F, M) transpose, to be written (an empty tensor in its place if not
    `transposed`)."""
    shape_t = (f, m) if transposed else (0,)
    return [torch.empty(m, f, device=like.device, dtype=dtype), torch.empty(shape_t, device=like.device, dtype=dtype)]


@triton_op("cs336_fp8::swiglu_amax", mutates_args={})
def swiglu_amax(h1: torch.Tensor, h3: torch.Tensor) -> torch.Tensor:
    return _launch(_swiglu_kernel, SWIGLU_TILE, (h1, h3), None, None, 1, E4M3, record=True)[0]


@triton_op("cs336_fp8::swiglu_cast", mutates_args={})
def swiglu_cast(
    h1: torch.Tensor, h3: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, record: bool, transposed: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = _fp8_pair(*h1.shape, h1, dtype, transposed)
    return (*g, *_launch(_swiglu_kernel, SWIGLU_TILE, (h1, h3), g, scale, 1, dtype, record, transposed))


@triton_op("cs336_fp8::swiglu_grad_amax", mutates_args={})
def swiglu_grad_amax(dg: torch.Tensor, h1: torch.Tensor, h3: torch.Tensor) -> torch.Tensor:
    return _launch(_swiglu_grad_kernel, SWIGLU_GRAD_TILE, (dg, h1, h3), None, None, 2, E5M2, record=True)[0]


@triton_op("cs336_fp8::swiglu_grad_cast", mutates_args={})
def swiglu_grad_cast(
    dg: torch.Tensor,
    h1: torch.Tensor,
    h3: torch.Tensor,
    scales: torch.Tensor,
    dtype: torch.dtype,
    record: bool,
    transposed: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    grads = _fp8_pair(*dg.shape, dg, dtype, transposed) + _fp8_pair(*dg.shape, dg, dtype, transposed)
    return (
        *grads,
        *_launch(_swiglu_grad_kernel, SWIGLU_GRAD_TILE, (dg, h1, h3), grads, scales, 2, dtype, record, transposed),
    )
