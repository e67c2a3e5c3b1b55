"""The whole SwiGLU feed-forward in FP8, its activations produced in FP8 (`--fp8_fused_swiglu`, on by default).

y = W2 (silu(W1 x) * W3 x). With FP8 linears alone, the SwiGLU output g and, in backward, the gradients dh1 and dh3 are
written in BF16 and then re-read by each cast. Here one autograd function runs the block: the kernel that computes g (or
dh1 and dh3) writes it directly in FP8, with the transposed copy the weight-gradient GEMM needs
(kernels/swiglu_triton.py on CUDA; kernels/swiglu_reference.py, the same math in torch, in CPU emulation). x is cast
once for W1 and W3; h1 and h3 are kept in BF16 for backward, as the BF16 module keeps them. dh1 and dh3 are written side
by side, so x's gradient is one GEMM against W1's and W3's W^T side by side (linear.joint_dgrad).
"""

from __future__ import annotations

from types import ModuleType

import torch
from torch import nn

from cs336_basics.kernels import kernels_for, swiglu_reference
from cs336_basics.precision.fused.linear import (
    backward_gemms,
    forward_gemm,
    joint_columns,
    joint_dgrad,
    joint_dgrad_scales,
    weight_gradient,
)
from cs336_basics.precision.fused.scaling import GRAD, INPUT, SiteScaling, produce_scales


def swiglu_ops(device: torch.device) -> ModuleType:
    """The producer implementation for `device`: Triton kernels on CUDA, the torch definition elsewhere."""
    return kernels_for(device, swiglu_reference)


def swiglu_input_gradient(
    ops: ModuleType,
    dg: torch.Tensor,
    h1: torch.Tensor,
    h3: torch.Tensor,
    scalings: tuple[SiteScaling, SiteScaling],
    weight_invs: tuple[torch.Tensor, torch.Tensor],
    joint_t: torch.Tensor,
    record: bool,
    fast: bool,
    transposed: bool,
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """x's gradient from SwiGLU's (dg, h1, h3): dh1 and dh3 written side by side in FP8 by the producer (cast by
    linear.joint_dgrad_scales), then one GEMM against W1's and W3's W^T side by side (`joint_t`). Returns (dx,
    (dh1^T, dh3^T) in FP8 by w1's and w3's own scales, empty unless `transposed`, their inverse scales) for the weight
    gradients. `scalings` are w1's and w3's; `fast`: fast accumulation in the GEMM."""
    s1, s3 = scalings
    scales, invs = produce_scales(scalings, GRAD, lambda: ops.swiglu_grad_amax(dg, h1, h3))
    joint_scales, joint_inv = joint_dgrad_scales(list(invs), list(weight_invs))
    rows = (*s1.producer_rows(GRAD, record, dg), *s3.producer_rows(GRAD, record, dg))
    dh13, *transposes = ops.swiglu_grad_cast(
        dg, h1, h3, scales, joint_scales, s1.dtypes[GRAD], record and s1.delayed, *rows, transposed
    )
    return joint_dgrad(dh13, joint_inv, joint_t, fast), tuple(transposes), invs


class _Fp8SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, ops: ModuleType, scalings: tuple[SiteScaling, ...], record: bool, w1, w3, w2):
        s1, s3, s2 = scalings
        x2 = x.reshape(-1, x.shape[-1])
        # *_inv: the inverse scales the GEMMs take.
        x_fp8, x_inv = s1.cast(x2, INPUT, record)
        h1, w1_t, w1_inv = forward_gemm(x_fp8, x_inv, w1, s1, record)
        h3, w3_t, w3_inv = forward_gemm(x_fp8, x_inv, w3, s3, record)
        g_scale, (g_inv,) = produce_scales((s2,), INPUT, lambda: ops.swiglu_amax(h1, h3))
        rows = s2.producer_rows(INPUT, record, h1)
        g_fp8, g_fp8_t = ops.swiglu_cast(h1, h3, g_scale, s2.dtypes[INPUT], record and s2.delayed, *rows)
        y, w2_t, w2_inv = forward_gemm(g_fp8, g_inv, w2, s2, record)
        ctx.save_for_backward(s1.transposed(x_fp8), x_inv, h1, h3, g_fp8_t, g_inv, w1_t, w1_inv, w3_t, w3_inv, w2_t,
                              w2_inv)  # fmt: skip
        ctx.ops, ctx.scalings, ctx.record = ops, scalings, record
        return y.reshape(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, dy):
        x_fp8_t, x_inv, h1, h3, g_fp8_t, g_inv, w1_t, w1_inv, w3_t, w3_inv, w2_t, w2_inv = ctx.saved_tensors
        ops, (s1, s3, s2), record = ctx.ops, ctx.scalings, ctx.record
        fast = s2.fast_accum_backward
        dy_fp8, dy_inv = s2.cast(dy.reshape(-1, dy.shape[-1]), GRAD, record)
        dg, dw2 = backward_gemms(dy_fp8, s2.transposed(dy_fp8), dy_inv, w2_t, w2_inv, g_fp8_t, g_inv, fast)
        joint_t = joint_columns([w1_t, w3_t])  # the weights' W^T side by side, for the one input-gradient GEMM
        dx, (dh1_t, dh3_t), (dh1_inv, dh3_inv) = swiglu_input_gradient(
            ops, dg, h1, h3, (s1, s3), (w1_inv, w3_inv), joint_t, record, fast, transposed=True
        )
        dw1 = weight_gradient(dh1_t, dh1_inv, x_fp8_t, x_inv, fast)
        dw3 = weight_gradient(dh3_t, dh3_inv, x_fp8_t, x_inv, fast)
        return dx.reshape(*dy.shape[:-1], dx.shape[-1]), None, None, None, dw1, dw3, dw2


class Fp8SwiGLU(nn.Module):
    """Stands in for a SwiGLU module: the same w1, w2, w3 linears (same parameters and state-dict keys), run as one
    FP8 block. Their scalings are theirs: w1's and w3's scale their weights and output gradients (w1's also the
    shared input), w2's its weight, its input g and its output gradient."""

    input_gradient_gemms_joined = 1  # w1 and w3: one input-gradient GEMM, not 2 (the verify tool counts them)

    def __init__(self, w1: nn.Linear, w2: nn.Linear, w3: nn.Linear, scalings: tuple[SiteScaling, ...]):
        super().__init__()
        self.w1, self.w2, self.w3 = w1, w2, w3
        self.scalings = nn.ModuleList(scalings)  # (w1, w3, w2)
        self.ops = swiglu_ops(w1.weight.device)
        self.producers = "Triton kernels" if w1.weight.device.type == "cuda" else "torch reference"

    @property
    def linears(self) -> tuple[nn.Linear, ...]:
        return (self.w1, self.w3, self.w2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Amaxes are recorded in training only: evaluation and sampling must not move the scales.
        return _Fp8SwiGLU.apply(
            x, self.ops, tuple(self.scalings), self.training, self.w1.weight, self.w3.weight, self.w2.weight
        )

    def extra_repr(self) -> str:
        return f"fp8, producers: {self.producers}"
