"""Attention's q/k/v projections and RoPE as one FP8 unit (`--fp8_fused_rope`, on by default).

As a shared-input group (linear.py: Fp8SharedInputLinears) q, k and v cast their input once. Here the unit also rotates
q and k, so that in backward one kernel takes attention's gradients of q, k and v as they come, applies RoPE's backward
to q's and k's, and writes each straight in FP8, row-major and transposed, with its delayed-scaling recordings
(kernels/rope_triton.py on CUDA; kernels/rope_reference.py, the same math in torch, in CPU emulation). Unfused, the
rotated gradients are written in BF16 and re-read by casts that reduce each token's row across the heads. The three FP8
gradients sit side by side in one matrix, so the input gradient is one GEMM against the three weights' W^T side by side
(linear.joint_dgrad), where three GEMMs would each write a BF16 result for a sum to read back. The forward rotates with
the model's own RotaryEmbedding, so its values are the BF16 module's.
"""

from __future__ import annotations

from types import ModuleType

import torch
from torch import nn

from cs336_basics.kernels import kernels_for, rope_reference
from cs336_basics.model.attention import CausalSelfAttention
from cs336_basics.model.layers import RotaryEmbedding
from cs336_basics.precision.fused.linear import (
    forward_gemm,
    joint_columns,
    joint_dgrad,
    joint_dgrad_scales,
    weight_gradient,
)
from cs336_basics.precision.fused.scaling import GRAD, INPUT, SiteScaling, produce_scales


def rope_unit_heads(module: nn.Module) -> tuple[int, int, int] | None:
    """q's, k's and v's head counts if `module` is an attention whose q/k/v group can also take over its RoPE (a
    CausalSelfAttention with RoPE), else None."""
    if isinstance(module, CausalSelfAttention) and module.rope is not None:
        return module.n_heads, module.n_kv_heads, module.n_kv_heads
    return None


def rope_ops(device: torch.device) -> ModuleType:
    """The producer implementation for `device`: the Triton kernel on CUDA, the torch definition elsewhere."""
    return kernels_for(device, rope_reference)


def qkv_grad_cast_args(
    ops: ModuleType,
    rope: RotaryEmbedding,
    positions: torch.Tensor | None,
    grads: tuple[torch.Tensor, ...],
    scalings: tuple[SiteScaling, ...],
    weight_invs: list[torch.Tensor],
    record: bool,
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...], torch.Tensor, torch.Tensor, bool, list[torch.Tensor]]:
    """What rope_grad_cast_qkv and the GEMMs after it take for q's, k's and v's gradients: (the sites' own scales
    (3,) and their inverses (for the transposes and the weight gradients), the joint input-gradient GEMM's scales (3,)
    and its inverse scale (joint_dgrad_scales), whether to record, the sites' row buffers in the op's order). Dynamic
    scaling first takes each rotated gradient's amax; delayed scaling records into the rows."""
    scales, invs, rows = [], [], []
    for i, (grad, scaling) in enumerate(zip(grads, scalings, strict=True)):
        rotate = i < 2  # q and k are rotated back; v is not

        def amax(grad=grad, rotate=rotate) -> torch.Tensor:
            return ops.rope_grad_amax(grad, rope.cos, rope.sin, positions, rotate)

        scale, (g_inv,) = produce_scales((scaling,), GRAD, amax)
        scales.append(scale.reshape(1))
        invs.append(g_inv)
        rows.extend(scaling.producer_rows(GRAD, record, grad))
    joint_scales, joint_inv = joint_dgrad_scales(invs, weight_invs)
    return torch.cat(scales), tuple(invs), joint_scales, joint_inv, record and scalings[0].delayed, rows


class _Fp8QkvRope(torch.autograd.Function):
    """(q, k, v) as (batch, heads, seq, head_dim), q and k rotated, from x (batch, seq, dim): three FP8 GEMMs on one
    cast of x. `heads` is each output's head count; `positions` None or integer (batch or 1, seq). Backward: one
    input-gradient GEMM over the three gradients side by side (cast by linear.joint_dgrad_scales), and a
    weight-gradient GEMM each, over its transpose cast by its site's own scale, as an unjoined layer's."""

    @staticmethod
    def forward(ctx, x, ops: ModuleType, rope: RotaryEmbedding, heads: tuple[int, ...], positions,
                scalings: tuple[SiteScaling, ...], record: bool, *weights):  # fmt: skip
        batch, seq, _ = x.shape
        x_fp8, x_inv = scalings[0].cast(x.reshape(-1, x.shape[-1]), INPUT, record)
        outputs, saved_weights, weight_invs = [], [], []
        for weight, scaling, n in zip(weights, scalings, heads, strict=True):
            y, w_fp8_t, w_inv = forward_gemm(x_fp8, x_inv, weight, scaling, record)
            outputs.append(y.view(batch, seq, n, -1).transpose(1, 2))
            saved_weights.append(w_fp8_t)
            weight_invs.append(w_inv)
        # The rotation RotaryEmbedding.forward applies, with its positions in attention's layout (a heads axis).
        angles = None if positions is None else positions.unsqueeze(1)
        q, k, v = rope(outputs[0], angles), rope(outputs[1], angles), outputs[2]
        ctx.save_for_backward(scalings[0].transposed(x_fp8), x_inv, positions, *saved_weights, *weight_invs)
        ctx.ops, ctx.rope, ctx.scalings, ctx.record = ops, rope, scalings, record
        return q, k, v

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        x_fp8_t, x_inv, positions, *rest = ctx.saved_tensors
        weights_t, weight_invs = rest[:3], rest[3:]
        ops, rope, record, scalings = ctx.ops, ctx.rope, ctx.record, ctx.scalings
        scales, g_invs, joint_scales, joint_inv, recording, rows = qkv_grad_cast_args(
            ops, rope, positions, grads, scalings, weight_invs, record
        )
        g_fp8, *g_fp8_t = ops.rope_grad_cast_qkv(
            *grads, rope.cos, rope.sin, positions, scales, joint_scales, scalings[0].dtypes[GRAD], recording,
            [False] * 3, True, *rows,
        )  # fmt: skip
        fast = scalings[0].fast_accum_backward
        dx = joint_dgrad(g_fp8, joint_inv, joint_columns(weights_t), fast)
        dws = [weight_gradient(g_t, g_inv, x_fp8_t, x_inv, fast) for g_t, g_inv in zip(g_fp8_t, g_invs, strict=True)]
        batch, _, seq, _ = grads[0].shape
        return dx.view(batch, seq, -1), None, None, None, None, None, None, *dws


class Fp8QkvRope(nn.Module):
    """Stands in for attention's q/k/v projections and RoPE (a CausalSelfAttention's `qkv_rope`): the same q_proj,
    k_proj and v_proj weights (so the same state-dict keys and optimizer state), run as one FP8 unit with the
    attention's own RotaryEmbedding. The scalings are the linears' own; q_proj's also scales the shared input."""

    input_gradient_gemms_joined = 2  # q, k and v: one input-gradient GEMM, not 3 (the verify tool counts them)

    def __init__(self, linears: tuple[nn.Linear, ...], scalings: tuple[SiteScaling, ...], rope: RotaryEmbedding,
                 heads: tuple[int, int, int]):  # fmt: skip
        super().__init__()
        self.linears = tuple(linears)  # not registered: they stay where the model has them
        self.scalings = nn.ModuleList(scalings)
        self.rope = (rope,)  # not registered: the attention (and the model) owns it
        self.heads = heads
        self.ops = rope_ops(linears[0].weight.device)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """x: (batch, seq, dim); positions: None or integer, (seq,) or (batch or 1, seq). Returns (q, k, v) as
        (batch, heads, seq, head_dim), q and k rotated."""
        if positions is not None:
            positions = positions.reshape(-1, x.shape[1]).contiguous()
        return _Fp8QkvRope.apply(
            x, self.ops, self.rope[0], self.heads, positions, tuple(self.scalings), self.training,
            *(layer.weight for layer in self.linears),
        )  # fmt: skip

    def extra_repr(self) -> str:
        return f"q/k/v projections and RoPE as one unit, fp8, producer: {self.ops.__name__.rsplit('.', 1)[-1]}"
