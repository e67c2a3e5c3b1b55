"""FP8 linear layers: their three GEMMs run in FP8, their casts cost as little as they can.

y = x W^T (forward), dx = dy W (grad_input) and dW = dy^T x (grad_weight) are `torch._scaled_mm` calls on FP8
operands (E4M3 for x and W, E5M2 for dy in the hybrid format). What differs from TorchAO's Float8Linear is what
happens around them:

- the FP8 input and weight are saved for backward, already transposed into the layout their backward GEMM wants
  (cuBLAS's FP8 GEMM takes its operands K-major, i.e. A row-major and B column-major), instead of the BF16 tensors
  that backward would read again to re-scale, re-cast and transpose: half the bytes kept, no second cast;
- layers that read the same input (q/k/v, w1/w3) share one cast of it, and the FP8 copy saved for backward
  (`Fp8SharedInputLinears`); each keeps its own weight, GEMMs and gradient cast (concatenating their gradients
  into one tensor measured slower than the casts it saves);
- with delayed scaling a cast needs no pass over its tensor beforehand, so inductor can fuse it into the kernel
  that produces the tensor (scaling.py).

Everything here is plain torch code inside one autograd.Function: torch.compile traces it (fullgraph) and inductor
fuses the casts, transposes and amax reductions into the surrounding kernels (except, with delayed scaling on CUDA,
the transposes and the weight's cast, Triton kernels of their own: SiteScaling.transposed and cast_transposed say
why).
"""

from __future__ import annotations

import torch
from torch import nn

from cs336_basics.precision.fused.scaling import GRAD, INPUT, WEIGHT, SiteScaling


class _Fp8Linears(torch.autograd.Function):
    """x @ W_i^T for one or more weights that share the input x, every GEMM in FP8, x cast once.

    x: (..., K) BF16; weights: (N_i, K) BF16; scalings[i] scales weight i and its output gradient (scalings[0]
    also the shared input). Returns one output per weight, so autograd hands backward one gradient per weight.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, scalings: tuple[SiteScaling, ...], record: bool, *weights: torch.Tensor):
        x2 = x.reshape(-1, x.shape[-1])
        x_fp8, x_scale_inv = scalings[0].cast(x2, INPUT, record)
        outputs, saved_weights, weight_scale_invs = [], [], []
        for weight, scaling in zip(weights, scalings, strict=True):
            y, w_fp8_t, w_scale_inv = forward_gemm(x_fp8, x_scale_inv, weight, scaling, record)
            outputs.append(y.reshape(*x.shape[:-1], weight.shape[0]))
            saved_weights.append(w_fp8_t)
            weight_scale_invs.append(w_scale_inv)
        # grad_weight wants x column-major as its B, i.e. x^T row-major: one copy, shared by every weight.
        ctx.save_for_backward(scalings[0].transposed(x_fp8), x_scale_inv, *saved_weights, *weight_scale_invs)
        ctx.scalings, ctx.record = scalings, record
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        x_fp8_t, x_scale_inv, *rest = ctx.saved_tensors
        n = len(grads)
        weights_t, weight_scale_invs = rest[:n], rest[n:]
        dx, dws = None, []
        for dy, scaling, w_t, w_scale_inv in zip(grads, ctx.scalings, weights_t, weight_scale_invs, strict=True):
            g_fp8, g_scale_inv = scaling.cast(dy.reshape(-1, dy.shape[-1]), GRAD, ctx.record)
            g_fp8_t = scaling.transposed(g_fp8)
            fast = scaling.fast_accum_backward
            part, dw = backward_gemms(g_fp8, g_fp8_t, g_scale_inv, w_t, w_scale_inv, x_fp8_t, x_scale_inv, fast)
            dx = part if dx is None else dx + part
            dws.append(dw)
        return dx.reshape(*grads[0].shape[:-1], dx.shape[-1]), None, None, *dws


def forward_gemm(
    x_fp8: torch.Tensor, x_scale_inv: torch.Tensor, weight: torch.Tensor, scaling: SiteScaling, record: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """y = x W^T in FP8 (x already cast, 2-D). Returns y and what backward needs of the weight: W^T in FP8, row-major
    (grad_input's B operand, column-major W), and its inverse scale."""
    w_fp8, w_fp8_t, w_scale_inv = scaling.cast_transposed(weight, WEIGHT, record)
    # B = W^T, column-major as the FP8 GEMM wants it: the row-major W viewed transposed. Fast accumulation in the
    # forward GEMM, as TorchAO's recipes use.
    y = fp8_matmul(x_fp8, x_scale_inv, w_fp8.t(), w_scale_inv, fast_accum=True)
    return y, w_fp8_t, w_scale_inv


def fp8_matmul(
    a: torch.Tensor, a_scale_inv: torch.Tensor, b: torch.Tensor, b_scale_inv: torch.Tensor, fast_accum: bool
) -> torch.Tensor:
    """a @ b in BF16 from FP8 operands and the inverses of the scales they were cast with (a row-major, b
    column-major, as cuBLAS's FP8 GEMM takes them)."""
    return torch._scaled_mm(
        a, b, scale_a=a_scale_inv, scale_b=b_scale_inv, out_dtype=torch.bfloat16, use_fast_accum=fast_accum
    )


def backward_gemms(
    g_fp8: torch.Tensor,
    g_fp8_t: torch.Tensor,
    g_scale_inv: torch.Tensor,
    w_fp8_t: torch.Tensor,
    w_scale_inv: torch.Tensor,
    x_fp8_t: torch.Tensor,
    x_scale_inv: torch.Tensor,
    fast_accum: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dW) = (dy W, dy^T x) in FP8, from the output gradient cast to FP8 (row-major and transposed) and the
    operands forward saved (W^T and x^T, row-major)."""
    dx = fp8_matmul(g_fp8, g_scale_inv, w_fp8_t.t(), w_scale_inv, fast_accum)
    return dx, weight_gradient(g_fp8_t, g_scale_inv, x_fp8_t, x_scale_inv, fast_accum)


def weight_gradient(
    g_fp8_t: torch.Tensor, g_scale_inv: torch.Tensor, x_fp8_t: torch.Tensor, x_scale_inv: torch.Tensor, fast: bool
) -> torch.Tensor:
    """dW = dy^T x in FP8, from the output gradient's and the input's FP8 transposes (row-major)."""
    return fp8_matmul(g_fp8_t, g_scale_inv, x_fp8_t.t(), x_scale_inv, fast)


def joint_dgrad_scales(
    grad_scale_invs: list[torch.Tensor], weight_scale_invs: list[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """dx = sum_i dy_i W_i as one FP8 GEMM over [dy_1 .. dy_n] and [W_1; ..; W_n] takes one scale for all the
    products, so each dy_i is cast with the scale that gives every (dy_i, W_i) pair the same product of inverse
    scales: the largest of the pairs' own. Returns (the casts' scales, shape (n,); that product, the GEMM's
    inverse scale). No cast scale exceeds the site's own, so none saturates more; a smaller one only moves a gradient
    down E5M2's range, which spans some thirty binades."""
    weight_invs = torch.stack([inv.reshape(()) for inv in weight_scale_invs])
    products = torch.stack([inv.reshape(()) for inv in grad_scale_invs]) * weight_invs
    joint_inv = products.max()
    return weight_invs / joint_inv, joint_inv.reshape(1)


def joint_dgrad(grads_fp8: torch.Tensor, joint_inv: torch.Tensor, joint_t: torch.Tensor, fast: bool) -> torch.Tensor:
    """dx = sum_i dy_i W_i as one FP8 GEMM: the gradients side by side (cast by joint_dgrad_scales), against the
    weights' W^T side by side (joint_columns)."""
    return fp8_matmul(grads_fp8, joint_inv, joint_t.t(), torch.ones_like(joint_inv), fast)


def joint_columns(tensors: list[torch.Tensor]) -> torch.Tensor:
    """FP8 matrices of one height side by side, copied as bytes: traced, inductor turns a copy into a Triton kernel of
    the tensors' dtype, and one of FP8 values failed to build on the H100
    (INDEX.md: 2026-11-27-lora-defaults-both-gpus, item 5); one of bytes is any copy."""
    return torch.cat([t.view(torch.uint8) for t in tensors], dim=1).view(tensors[0].dtype)


def fp8_linears(
    x: torch.Tensor, weights: tuple[torch.Tensor, ...], scalings: tuple[SiteScaling, ...], record: bool
) -> tuple[torch.Tensor, ...]:
    return _Fp8Linears.apply(x, scalings, record, *weights)


class Fp8Linear(nn.Module):
    """Stands in for an nn.Linear without bias: the same `weight` Parameter (so the same state-dict key and the
    same optimizer state), its GEMMs in FP8."""

    def __init__(self, linear: nn.Linear, scaling: SiteScaling):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.scaling = scaling

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Amaxes are recorded in training only: evaluation and sampling must not move the scales.
        return fp8_linears(x, (self.weight,), (self.scaling,), self.training)[0]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8"


class Fp8SharedInputLinears(nn.Module):
    """Runs linear layers that read the same input (a model's SHARED_INPUT group) in FP8, casting that input once.
    The layers keep their weights and state-dict keys where the model has them; this module only refers to them."""

    def __init__(self, linears: tuple[nn.Linear, ...], scalings: tuple[SiteScaling, ...]):
        super().__init__()
        self.linears = tuple(linears)  # not registered: they stay where the model has them
        self.scalings = nn.ModuleList(scalings)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return fp8_linears(x, tuple(layer.weight for layer in self.linears), tuple(self.scalings), self.training)

    def extra_repr(self) -> str:
        return f"{len(self.linears)} linears sharing one input cast, fp8"
