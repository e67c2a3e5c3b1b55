"""The linear layer of a LoRA fine-tune: a frozen base weight, in BF16 or FP8, plus optional trainable adapters.

    y = x W^T + (alpha / r) * dropout(x) A^T B^T      W (out, in) frozen; A (r, in), B (out, r) trained, B = 0 at first

What the frozen base changes, and what this module uses:
- W gets no gradient, so its backward is one GEMM (dx = dy W), not two: the weight-gradient GEMM is never run,
  and x is not saved for it (the adapters save their own input, the dropout's output).
- W never changes, so its FP8 copy is made once, when the layer is built, in both layouts its GEMMs read (W for
  forward, W^T for backward), with one tensorwise scale. Each step casts only x (E4M3) and dy (E5M2), dynamically.
  A pretraining FP8 linear casts W twice per step and runs three GEMMs.
- The adapters stay in the weight dtype (BF16 on a GPU): at rank r their GEMMs are thin, memory-bound, and FP8 would
  buy nothing there. The optimizer keeps their fp32 masters, as for any trainable BF16 weight.

State-dict keys: the base weight keeps the key it had in the plain model (`...q_proj.weight`), the adapters add
`...q_proj.lora_a` and `...q_proj.lora_b`. Checkpoints of a LoRA run hold the trainable tensors only.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from cs336_basics.precision.fused.scaling import E4M3, E5M2, dynamic_cast


class _FrozenFp8Matmul(torch.autograd.Function):
    """x W^T with W given as its cached FP8 copies: forward one FP8 GEMM, backward one (dx only)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w_fp8: torch.Tensor, w_fp8_t: torch.Tensor, w_scale: torch.Tensor):
        x2 = x.reshape(-1, x.shape[-1])
        x_fp8, x_scale = dynamic_cast(x2, E4M3)
        # B operands column-major, as the FP8 GEMM wants them: W viewed transposed here, W^T viewed transposed below.
        y = torch._scaled_mm(
            x_fp8, w_fp8.t(), scale_a=x_scale.reciprocal(), scale_b=w_scale.reciprocal(), out_dtype=x.dtype,
            use_fast_accum=True,
        )  # fmt: skip
        ctx.save_for_backward(w_fp8_t, w_scale)  # not x: there is no weight gradient to compute
        ctx.x_dtype = x.dtype
        return y.reshape(*x.shape[:-1], w_fp8.shape[0])

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        w_fp8_t, w_scale = ctx.saved_tensors
        g_fp8, g_scale = dynamic_cast(dy.reshape(-1, dy.shape[-1]), E5M2)
        dx = torch._scaled_mm(
            g_fp8, w_fp8_t.t(), scale_a=g_scale.reciprocal(), scale_b=w_scale.reciprocal(), out_dtype=ctx.x_dtype
        )
        return dx.reshape(*dy.shape[:-1], w_fp8_t.shape[0]), None, None, None


class FrozenLinear(nn.Module):
    """Stands in for an nn.Linear (no bias) of a fine-tuned base: its weight frozen, its GEMMs in FP8 when `fp8`,
    LoRA adapters on it when `rank` > 0."""

    def __init__(self, linear: nn.Linear, fp8: bool, rank: int = 0, scale: float = 1.0, dropout: float = 0.0):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.weight.requires_grad_(False)
        self.fp8 = fp8
        self.rank, self.scale = rank, scale
        if fp8:
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
        w_fp8, w_scale = dynamic_cast(self.weight, E4M3)
        self.register_buffer("weight_fp8", w_fp8, persistent=False)
        self.register_buffer("weight_fp8_t", w_fp8.t().contiguous(), persistent=False)
        self.register_buffer("weight_scale", w_scale, persistent=False)
        self.weight_casts += 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fp8:
            y = _FrozenFp8Matmul.apply(x, self.weight_fp8, self.weight_fp8_t, self.weight_scale)
        else:
            y = nn.functional.linear(x, self.weight)  # W frozen: autograd computes dx only
        if self.rank > 0:
            y = y + (self.dropout(x) @ self.lora_a.t() @ self.lora_b.t()) * self.scale
        return y

    @torch.no_grad()
    def merged_weight(self) -> torch.Tensor:
        """W + scale * B A in the weight's dtype (computed in float32): the plain linear's weight with the adapters
        folded in."""
        if self.rank == 0:
            return self.weight.detach().clone()
        delta = self.scale * (self.lora_b.float() @ self.lora_a.float())
        return (self.weight.float() + delta).to(self.weight.dtype)

    def extra_repr(self) -> str:
        base = f"in_features={self.in_features}, out_features={self.out_features}, frozen, {'fp8' if self.fp8 else ''}"
        return base.rstrip(", ") + (f", lora rank {self.rank} scale {self.scale:g}" if self.rank else "")
