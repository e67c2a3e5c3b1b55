"""The layers of a LoRA fine-tune: frozen base weights, in BF16 or FP8, plus optional trainable adapters.

    y = x W^T + (alpha / r) * dropout(x) A^T B^T      W (out, in) frozen; A (r, in), B (out, r) trained, B = 0 at first

What the frozen base changes, and what these modules use:
- W gets no gradient, so its backward is one GEMM (dx = dy W), not two: the weight-gradient GEMM is never run,
  and nothing is saved for it (neither x nor its FP8 copy; the adapters save their own input).
- W never changes, so its FP8 copy is made once, when the layer is built, in both layouts its GEMMs read (W for
  forward, W^T for backward), with one tensorwise scale. Each step casts only inputs (E4M3) and output gradients
  (E5M2 by default), dynamically. A pretraining FP8 linear casts W twice per step and runs three GEMMs.
- The FP8 base keeps the fused path's cast savings (precision/fused/), without what only trainable weights need:
  layers that read one input (q/k/v, w1/w3) cast it once (`FrozenSharedInput`); a SwiGLU block without adapters
  writes its activation and its gradients straight in FP8 from the fused path's kernels, without the transposed
  copies a weight gradient would read (`FrozenFp8SwiGLU`); the FP8 head computes the loss beside its GEMM and writes
  the logits' gradient in FP8 (`FrozenFp8LMHead`).
- The adapters stay in the weight dtype (BF16 on a GPU): at rank r their GEMMs are thin, memory-bound, and FP8 would
  buy nothing there. The optimizer keeps their fp32 masters, as for any trainable BF16 weight.

State-dict keys: the base weight keeps the key it had in the plain model (`...q_proj.weight`), the adapters add
`...q_proj.lora_a` and `...q_proj.lora_b`. Checkpoints of a LoRA run hold the trainable tensors only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from cs336_basics.precision.fused.head import cross_entropy_from_logits, fp8_logits_grad
from cs336_basics.precision.fused.linear import fp8_matmul
from cs336_basics.precision.fused.scaling import E4M3, E5M2, dynamic_cast, producer_scales
from cs336_basics.precision.fused.swiglu import swiglu_ops


@dataclass(frozen=True)
class FrozenFp8:
    """How a frozen base runs its FP8 GEMMs: the output gradients' format and whether the backward (input-gradient)
    GEMMs accumulate fast. Inputs are E4M3 and forward GEMMs accumulate fast, as in every FP8 path here."""

    grad_dtype: torch.dtype = E5M2
    fast_accum_backward: bool = False


def _triples(operands: tuple[torch.Tensor, ...]) -> list[tuple[torch.Tensor, ...]]:
    return [operands[i : i + 3] for i in range(0, len(operands), 3)]


class _FrozenFp8Linears(torch.autograd.Function):
    """x W_i^T for frozen weights that share the input x, given as cached FP8 operands (W_i, W_i^T, inverse scale):
    x cast once; forward one FP8 GEMM per weight, backward one (dx only) per weight."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, fp8: FrozenFp8, *operands: torch.Tensor):
        x2 = x.reshape(-1, x.shape[-1])
        x_fp8, x_scale_inv = dynamic_cast(x2, E4M3)
        outputs = []
        for w_fp8, _, w_scale_inv in _triples(operands):
            # B = W^T column-major, as the FP8 GEMM wants it: the row-major W viewed transposed.
            y = fp8_matmul(x_fp8, x_scale_inv, w_fp8.t(), w_scale_inv, fast_accum=True)
            outputs.append(y.reshape(*x.shape[:-1], w_fp8.shape[0]))
        ctx.save_for_backward(*[t for _, w_t, scale in _triples(operands) for t in (w_t, scale)])  # not x
        ctx.fp8, ctx.n_operands = fp8, len(operands)
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        saved = ctx.saved_tensors
        dx = None
        for i, dy in enumerate(grads):
            w_t, w_scale_inv = saved[2 * i], saved[2 * i + 1]
            g_fp8, g_scale_inv = dynamic_cast(dy.reshape(-1, dy.shape[-1]), ctx.fp8.grad_dtype)
            part = fp8_matmul(g_fp8, g_scale_inv, w_t.t(), w_scale_inv, ctx.fp8.fast_accum_backward)
            dx = part if dx is None else dx + part
        return dx.reshape(*grads[0].shape[:-1], dx.shape[-1]), None, *([None] * ctx.n_operands)


class FrozenLinear(nn.Module):
    """Stands in for an nn.Linear (no bias) of a fine-tuned base: its weight frozen, its GEMMs in FP8 when `fp8` is
    given, LoRA adapters on it when `rank` > 0."""

    def __init__(
        self, linear: nn.Linear, fp8: FrozenFp8 | None, rank: int = 0, scale: float = 1.0, dropout: float = 0.0
    ):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.weight.requires_grad_(False)
        self.fp8 = fp8
        self.rank, self.scale = rank, scale
        if fp8 is not None:
            self.weight_casts = 0  # how often the FP8 copy was made: once (tests count it)
            self.refresh_fp8_weight()
        if rank > 0:
            weight = linear.weight
            self.lora_a = nn.Parameter(torch.empty(rank, self.in_features, device=weight.device, dtype=weight.dtype))
            self.lora_b = nn.Parameter(torch.zeros(self.out_features, rank, device=weight.device, dtype=weight.dtype))
            # A as nn.Linear initialises its weight (Kaiming-uniform, a = sqrt(5)); B = 0, so the fine-tune starts
            # exactly at the base model.
            nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))
            self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    @torch.no_grad()
    def refresh_fp8_weight(self) -> None:
        """Make the FP8 copies of the weight (non-persistent buffers: the BF16 weight stays the saved one). Needed
        again only if the base weight is changed in place, e.g. by loading other base weights."""
        w_fp8, w_scale_inv = dynamic_cast(self.weight, E4M3)
        self.register_buffer("weight_fp8", w_fp8, persistent=False)
        self.register_buffer("weight_fp8_t", w_fp8.t().contiguous(), persistent=False)
        self.register_buffer("weight_scale_inv", w_scale_inv, persistent=False)
        self.weight_casts += 1

    @property
    def fp8_operands(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.weight_fp8, self.weight_fp8_t, self.weight_scale_inv

    def with_adapter(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The base output y of input x, plus the adapters' contribution if this layer has adapters."""
        if self.rank == 0:
            return y
        return y + (self.dropout(x) @ self.lora_a.t() @ self.lora_b.t()) * self.scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fp8 is not None:
            y = _FrozenFp8Linears.apply(x, self.fp8, *self.fp8_operands)[0]
        else:
            y = nn.functional.linear(x, self.weight)  # W frozen: autograd computes dx only
        return self.with_adapter(x, y)

    @torch.no_grad()
    def merged_weight(self) -> torch.Tensor:
        """W + scale * B A in the weight's dtype (computed in float32): the plain linear's weight with the adapters
        folded in."""
        if self.rank == 0:
            return self.weight.detach().clone()
        delta = self.scale * (self.lora_b.float() @ self.lora_a.float())
        return (self.weight.float() + delta).to(self.weight.dtype)

    def extra_repr(self) -> str:
        base = f"in_features={self.in_features}, out_features={self.out_features}, frozen"
        adapters = f", lora rank {self.rank} scale {self.scale:g}" if self.rank else ""
        return base + (", fp8" if self.fp8 else "") + adapters


class FrozenSharedInput(nn.Module):
    """Frozen FP8 linears that read one input (a model's SHARED_INPUT group, e.g. q/k/v), its cast made once. Each
    keeps its weight, its adapters and its state-dict keys where the model has them; this module only refers to them."""

    def __init__(self, linears: tuple[FrozenLinear, ...]):
        super().__init__()
        self.linears = tuple(linears)  # not registered: they stay where the model has them
        self.fp8 = linears[0].fp8

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        operands = [t for layer in self.linears for t in layer.fp8_operands]
        outputs = _FrozenFp8Linears.apply(x, self.fp8, *operands)
        return tuple(layer.with_adapter(x, y) for layer, y in zip(self.linears, outputs, strict=True))

    def extra_repr(self) -> str:
        return f"{len(self.linears)} frozen FP8 linears sharing one input cast"


class _FrozenFp8SwiGLU(torch.autograd.Function):
    """W2 (silu(W1 x) * W3 x) with frozen FP8 weights: x cast once, the activation g and the gradients dh1, dh3
    written in FP8 by the fused path's producer kernels (no transposes: there is no weight gradient)."""

    @staticmethod
    def forward(ctx, x, ops, fp8: FrozenFp8, w1, w1_t, s1, w3, w3_t, s3, w2, w2_t, s2):
        x2 = x.reshape(-1, x.shape[-1])
        x_fp8, x_scale_inv = dynamic_cast(x2, E4M3)
        h1 = fp8_matmul(x_fp8, x_scale_inv, w1.t(), s1, fast_accum=True)
        h3 = fp8_matmul(x_fp8, x_scale_inv, w3.t(), s3, fast_accum=True)
        g_scale, (g_inv,) = producer_scales(ops.swiglu_amax(h1, h3), E4M3)
        g_fp8 = ops.swiglu_cast(h1, h3, g_scale, E4M3, False, False)[0]
        y = fp8_matmul(g_fp8, g_inv, w2.t(), s2, fast_accum=True)
        ctx.save_for_backward(h1, h3, w1_t, s1, w3_t, s3, w2_t, s2)
        ctx.ops, ctx.fp8 = ops, fp8
        return y.reshape(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, dy):
        h1, h3, w1_t, s1, w3_t, s3, w2_t, s2 = ctx.saved_tensors
        ops, dtype, fast = ctx.ops, ctx.fp8.grad_dtype, ctx.fp8.fast_accum_backward
        dy_fp8, dy_scale_inv = dynamic_cast(dy.reshape(-1, dy.shape[-1]), dtype)
        dg = fp8_matmul(dy_fp8, dy_scale_inv, w2_t.t(), s2, fast)
        scales, (dh1_inv, dh3_inv) = producer_scales(ops.swiglu_grad_amax(dg, h1, h3), dtype)
        dh1, _, dh3, _, _, _ = ops.swiglu_grad_cast(dg, h1, h3, scales, dtype, False, False)
        dx = fp8_matmul(dh1, dh1_inv, w1_t.t(), s1, fast) + fp8_matmul(dh3, dh3_inv, w3_t.t(), s3, fast)
        return dx.reshape(*dy.shape[:-1], dx.shape[-1]), *([None] * 11)


class FrozenFp8SwiGLU(nn.Module):
    """Stands in for a SwiGLU block whose three linears are frozen FP8 FrozenLinears without adapters: the same
    w1, w2, w3 (same state-dict keys), run as one FP8 block."""

    def __init__(self, w1: FrozenLinear, w2: FrozenLinear, w3: FrozenLinear):
        super().__init__()
        self.w1, self.w2, self.w3 = w1, w2, w3
        self.ops = swiglu_ops(w1.weight.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        operands = (*self.w1.fp8_operands, *self.w3.fp8_operands, *self.w2.fp8_operands)
        return _FrozenFp8SwiGLU.apply(x, self.ops, self.w1.fp8, *operands)

    def extra_repr(self) -> str:
        return "frozen, fp8, activation and its gradients produced in FP8"


class _FrozenFp8LinearCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of x W^T with a frozen FP8 head: the logits' gradient written in FP8 where it is computed
    (precision/fused/head.py says why no amax pass is needed), one backward GEMM (dx)."""

    @staticmethod
    def forward(ctx, x, targets, fp8: FrozenFp8, w_fp8, w_t, w_scale_inv):
        x_fp8, x_scale_inv = dynamic_cast(x.reshape(-1, x.shape[-1]), E4M3)
        logits = fp8_matmul(x_fp8, x_scale_inv, w_fp8.t(), w_scale_inv, fast_accum=True)
        loss, lse, valid, count = cross_entropy_from_logits(logits, targets.reshape(-1))
        ctx.save_for_backward(logits, lse, targets.reshape(-1), valid, count, w_t, w_scale_inv)
        ctx.fp8, ctx.x_shape = fp8, x.shape
        return loss

    @staticmethod
    def backward(ctx, dloss):
        logits, lse, targets, valid, count, w_t, w_scale_inv = ctx.saved_tensors
        g_fp8, g_scale_inv = fp8_logits_grad(logits, lse, targets, valid, count, dloss, ctx.fp8.grad_dtype)
        dx = fp8_matmul(g_fp8, g_scale_inv, w_t.t(), w_scale_inv, ctx.fp8.fast_accum_backward)
        return dx.reshape(ctx.x_shape), None, None, None, None, None


class FrozenFp8LMHead(FrozenLinear):
    """The frozen FP8 lm_head (without adapters), which also computes the model's loss with its GEMM."""

    def linear_cross_entropy(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of `targets` under x W^T; the same value as cross_entropy(self(x), targets)."""
        return _FrozenFp8LinearCrossEntropy.apply(x, targets, self.fp8, *self.fp8_operands)
