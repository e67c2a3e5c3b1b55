"""A weight's delayed-scaling FP8 cast and its transposed copy as one Triton kernel (CUDA).

Every step each FP8 linear casts its BF16 weight: the forward GEMM takes it row-major, grad_input's GEMM transposed.
Left to inductor and the transpose kernel (transpose_triton.py), that is two launches per weight: a kernel that reads
the weight, writes it in FP8 and records its rows' amaxes and saturation counts, then one that reads the FP8 weight
back to write its transpose. Here each program reads a tile of the weight once and writes both layouts; with
`record` it files the tile's amax and saturation count straight into the site's row buffers (tiles.record_tile), with
no kernel of their own.
The operation, its signature and its numerics are cast_reference.py's; tests compare the two on the GPU. It is a torch
custom op (torch.library.triton_op), so torch.compile keeps it in its graph (fullgraph).

Imported only on CUDA machines: triton ships with torch's Linux CUDA wheels.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from cs336_basics.kernels.fp8_format import E4M3, E5M2, fp8_max
from cs336_basics.kernels.tiles import WEIGHT_CAST_TILE, record_tile, saturating_cast, tile_offsets

_INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@triton.jit
def _cast_transposed_kernel(
    x_ptr, out_ptr, out_t_ptr, scale_ptr, amax_ptr, sat_ptr, M, F, recorded_rows,
    LIMIT: tl.constexpr, RECORD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_F: tl.constexpr,
):  # fmt: skip
    offs, offs_t, mask = tile_offsets(M, F, BLOCK_M, BLOCK_F)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    scale = tl.load(scale_ptr)
    y = saturating_cast(x, scale, LIMIT, out_ptr.dtype.element_ty)
    tl.store(out_ptr + offs, y, mask=mask)
    tl.store(out_t_ptr + offs_t, y, mask=mask)
    if RECORD:
        record_tile(tl.abs(x), scale, amax_ptr, sat_ptr, recorded_rows, LIMIT)


@triton_op("cs336_fp8::cast_transposed", mutates_args={"amax_rows", "saturated_rows"})
def cast_transposed(
    x: torch.Tensor,
    scale: torch.Tensor,
    dtype: torch.dtype,
    record: bool,
    amax_rows: torch.Tensor,
    saturated_rows: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    if x.dim() != 2 or not x.is_contiguous() or not x.is_cuda or x.dtype not in _INPUT_DTYPES:
        raise ValueError("the cast kernel takes a contiguous 2-D CUDA tensor in BF16, FP16 or FP32")
    if scale.numel() != 1 or scale.dtype != torch.float32 or dtype not in (E4M3, E5M2):
        raise ValueError("the cast kernel takes one float32 scale, of shape () or (1,), and writes E4M3 or E5M2")
    buffers = (amax_rows.dtype, saturated_rows.dtype, saturated_rows.numel())
    if record and (amax_rows.numel() == 0 or buffers != (torch.float32, torch.int32, amax_rows.numel())):
        raise ValueError("recording takes a site's row buffers: float32 amaxes and int32 counts, of one length")
    m, f = x.shape
    out, out_t = torch.empty(m, f, device=x.device, dtype=dtype), torch.empty(f, m, device=x.device, dtype=dtype)
    # Without `record` the buffers may be empty stand-ins: the kernel is given x in their place and never reads it.
    amax, saturated = (amax_rows, saturated_rows) if record else (x, x)
    wrap_triton(_cast_transposed_kernel)[WEIGHT_CAST_TILE.grid(m, f)](
        x, out, out_t, scale.reshape(1), amax, saturated, m, f, amax.numel() if record else 1, LIMIT=fp8_max(dtype),
        RECORD=record, **WEIGHT_CAST_TILE.launch_options(),
    )  # fmt: skip
    return out, out_t
