"""SwiGLU's FP8 producers in plain torch: the definition the Triton kernels (swiglu_triton.py) must match, and the
implementation on CPU (FP8 emulation).

Four operations, the same names and signatures in both modules:
- `swiglu_amax(h1, h3)` -> amax of g = silu(h1) * h3, shape (1,): dynamic scaling's first pass;
- `swiglu_cast(h1, h3, scale, dtype, record, amax_rows, saturated_rows, transposed=True)` -> (g in FP8, its transpose
  in FP8): g is never written in BF16; without `transposed` (a frozen weight needs no weight gradient) the transpose
  is an empty tensor. `scale` has shape (1,). With `record` (delayed scaling) g's amax and its count of values that
  saturated are filed, in place, into a site's row buffers `amax_rows` and `saturated_rows` (max-accumulated and
  added; into which entries is each implementation's choice, as the update reduces each buffer to one number);
  without it they are not touched;
- `swiglu_grad_amax(dg, h1, h3)` -> amaxes (2,) of dh1 and dh3, the gradients of h1 and h3;
- `swiglu_grad_cast(dg, h1, h3, scales, joint_scales, dtype, record, amax_rows1, saturated_rows1, amax_rows3,
  saturated_rows3, transposed=True)` -> ([dh1 dh3] in FP8 side by side, the columns of one (M, 2F) matrix, cast by
  `joint_scales`: the operand of one input-gradient GEMM over both (linear.joint_dgrad_scales); dh1^T and dh3^T in
  FP8 by their sites' own `scales`, for the weight gradients), dh1 recorded against `scales[0]` into the first pair
  of buffers, dh3 against `scales[1]` into the second; the transposes empty without `transposed`.

Each value is first rounded to BF16 exactly where autograd of `F.silu(h1) * h3` in BF16 rounds it, so the FP8 tensors
are the casts of the BF16 tensors the unfused path would have written. All tensors are 2-D and row-major; the
transposes are row-major (F, M) copies, the layout cuBLAS's FP8 GEMM wants for the weight gradients.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from cs336_basics.kernels.fp8_format import cast_to_fp8, record_into_entry0


def swiglu(h1: torch.Tensor, h3: torch.Tensor) -> torch.Tensor:
    return F.silu(h1) * h3


def swiglu_grads(dg: torch.Tensor, h1: torch.Tensor, h3: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dh1, dh3) as autograd computes them for swiglu(h1, h3)."""
    return torch.ops.aten.silu_backward(dg * h3, h1), dg * F.silu(h1)


def swiglu_amax(h1: torch.Tensor, h3: torch.Tensor) -> torch.Tensor:
    return swiglu(h1, h3).abs().amax().float().reshape(1)


def _transpose(x: torch.Tensor, transposed: bool) -> torch.Tensor:
    return x.t().contiguous() if transposed else x.new_empty(0)


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
    g = swiglu(h1, h3)
    g_fp8 = cast_to_fp8(g, scale[0], dtype)
    if record:
        record_into_entry0(g, scale[0], dtype, amax_rows, saturated_rows)
    return g_fp8, _transpose(g_fp8, transposed)


def swiglu_grad_amax(dg: torch.Tensor, h1: torch.Tensor, h3: torch.Tensor) -> torch.Tensor:
    return torch.stack([d.abs().amax().float() for d in swiglu_grads(dg, h1, h3)])


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
    dh1, dh3 = swiglu_grads(dg, h1, h3)
    if record:
        record_into_entry0(dh1, scales[0], dtype, amax_rows1, saturated_rows1)
        record_into_entry0(dh3, scales[1], dtype, amax_rows3, saturated_rows3)
    joint = torch.cat([cast_to_fp8(dh1, joint_scales[0], dtype), cast_to_fp8(dh3, joint_scales[1], dtype)], dim=1)
    dh1_t, dh3_t = (_transpose(cast_to_fp8(dh, scales[k], dtype), transposed) for k, dh in enumerate((dh1, dh3)))
    return joint, dh1_t, dh3_t
