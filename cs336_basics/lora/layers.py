"""The layers of a LoRA fine-tune: frozen base weights, in BF16 or FP8, plus optional trainable adapters.

    y = x W^T + (alpha / r) * dropout(x) A^T B^T      W (out, in) frozen; A (r, in), B (out, r) trained, B = 0 at first

What the frozen base changes, and what these modules use:
- W gets no gradient, so its backward is one GEMM (dx = dy W), not two: the weight-gradient GEMM is never run,
  and nothing is saved for it (neither x nor its FP8 copy; the adapters save their own input).
- W never changes, so its FP8 copy is made once, when the layer is built, in both layouts its GEMMs read (W for
  forward, W^T for backward), with one tensorwise scale from W's own amax. Each step casts only inputs (E4M3) and
  output gradients (E5M2 by default), each scaled by its layer's SiteScaling: dynamically, or with `--fp8_scaling
  delayed` from earlier steps' amaxes, so the cast needs no amax pass first and no transposed copy is ever written
  (nothing reads one: there is no weight gradient). A pretraining FP8 linear casts W twice per step and runs three
  GEMMs.
- The FP8 base keeps the fused path's cast savings (precision/fused/), without what only trainable weights need:
  layers that read one input (q/k/v, w1/w3) cast it once (`FrozenSharedInput`); a SwiGLU block without adapters
  writes its activation and its gradients straight in FP8 from the fused path's kernels, without the transposed
  copies a weight gradient would read (`FrozenFp8SwiGLU`); attention's q/k/v also take over RoPE, so that one kernel
  rotates each gradient back and writes it in FP8, and in BF16 only for adapters (`FrozenFp8QkvRope`); the FP8 head
  computes the loss beside its GEMM and writes the logits' gradient in FP8 (`FrozenFp8LMHead`). In the two units,
  q/k/v's and w1/w3's input gradients are one GEMM each over their FP8 gradients side by side (`joint_dgrad`), not
  a GEMM per layer whose BF16 results a sum reads back.
- The adapters stay in the weight dtype (BF16 on a GPU): at rank r their GEMMs are thin, memory-bound, and FP8 would
  buy nothing there. The optimizer keeps their fp32 masters, as for any trainable BF16 weight. Adapters on layers
  that read one input (q/k/v) project it with one GEMM, their A matrices stacked (`adapter_deltas`), on either base:
  thin GEMMs cost what they read and write, and this reads x once instead of once per adapter.

State-dict keys: the base weight keeps the key it had in the plain model (`...q_proj.weight`), the adapters add
`...q_proj.lora_a` and `...q_proj.lora_b`. Checkpoints of a LoRA run hold the trainable tensors only.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from cs336_basics.kernels import rope_reference
from cs336_basics.model.layers import RotaryEmbedding
from cs336_basics.precision.fused.head import (
    logits_grad_scale_inv,
    loss_and_unit_grads_by_rows,
    loss_without_gradient,
)
from cs336_basics.precision.fused.linear import fp8_matmul, joint_columns, joint_dgrad
from cs336_basics.precision.fused.qkv_rope import qkv_grad_cast_args, rope_ops
from cs336_basics.precision.fused.scaling import (
    E4M3,
    GRAD,
    INPUT,
    SiteScaling,
    dynamic_cast,
    produce_scales,
)
from cs336_basics.precision.fused.swiglu import swiglu_input_gradient, swiglu_ops


def _triples(operands: tuple[torch.Tensor, ...]) -> list[tuple[torch.Tensor, ...]]:
    return [operands[i : i + 3] for i in range(0, len(operands), 3)]


class _FrozenFp8Linears(torch.autograd.Function):
    """x W_i^T for frozen weights that share the input x, given as cached FP8 operands (W_i, W_i^T, inverse scale):
    x cast once (by scalings[0]); forward one FP8 GEMM per weight, backward one (dx only) per weight, each output
    gradient cast by its layer's scaling. `record`: delayed scaling files this step's amaxes (training only)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, scalings: tuple[SiteScaling, ...], record: bool, *operands: torch.Tensor):
        x2 = x.reshape(-1, x.shape[-1])
        x_fp8, x_scale_inv = scalings[0].cast(x2, INPUT, record)
        outputs = []
        for w_fp8, _, w_scale_inv in _triples(operands):
            # B = W^T column-major, as the FP8 GEMM wants it: the row-major W viewed transposed.
            y = fp8_matmul(x_fp8, x_scale_inv, w_fp8.t(), w_scale_inv, fast_accum=True)
            outputs.append(y.reshape(*x.shape[:-1], w_fp8.shape[0]))
        ctx.save_for_backward(*[t for _, w_t, scale in _triples(operands) for t in (w_t, scale)])  # not x
        ctx.scalings, ctx.record, ctx.n_operands = scalings, record, len(operands)
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        saved = ctx.saved_tensors
        dx = None
        for i, (dy, scaling) in enumerate(zip(grads, ctx.scalings, strict=True)):
            w_t, w_scale_inv = saved[2 * i], saved[2 * i + 1]
            g_fp8, g_scale_inv = scaling.cast(dy.reshape(-1, dy.shape[-1]), GRAD, ctx.record)
            part = fp8_matmul(g_fp8, g_scale_inv, w_t.t(), w_scale_inv, scaling.fast_accum_backward)
            dx = part if dx is None else dx + part
        return dx.reshape(*grads[0].shape[:-1], dx.shape[-1]), None, None, *([None] * ctx.n_operands)


class FrozenLinear(nn.Module):
    """Stands in for an nn.Linear (no bias) of a fine-tuned base: its weight frozen, its GEMMs in FP8 when `scaling`
    (how its input and output gradient are cast) is given, LoRA adapters on it when `rank` > 0."""

    def __init__(
        self,
        linear: nn.Linear,
        scaling: SiteScaling | None,
        rank: int = 0,
        scale: float = 1.0,
        dropout: float = 0.0,
    ):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.weight.requires_grad_(False)
        self.scaling = scaling
        self.rank, self.scale = rank, scale
        self.joint: tuple[nn.Module, int] | None = None  # (unit, first column) once join_fp8_weights_t joins W^T
        if scaling is not None:
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

    @property
    def fp8(self) -> bool:
        return self.scaling is not None

    @torch.no_grad()
    def refresh_fp8_weight(self) -> None:
        """Make the FP8 copies of the weight (non-persistent buffers: the BF16 weight stays the saved one), scaled
        by the weight's own amax. Needed again only if the base weight is changed in place, e.g. by loading other
        base weights. The copies stay where the first ones were made (LoRAConverter may have moved the BF16 weight
        to CPU memory)."""
        device = self.weight_fp8.device if self.weight_casts else self.weight.device
        w_fp8, w_scale_inv = dynamic_cast(self.weight.to(device), E4M3)
        if self.weight_casts:  # in place: W^T may be columns of a unit's joint copy (join_fp8_weights_t)
            self.weight_fp8.copy_(w_fp8)
            self._weight_fp8_t_target().copy_(w_fp8.t())
            self.weight_scale_inv.copy_(w_scale_inv)
        else:
            self.register_buffer("weight_fp8", w_fp8, persistent=False)
            self.register_buffer("weight_fp8_t", w_fp8.t().contiguous(), persistent=False)
            self.register_buffer("weight_scale_inv", w_scale_inv, persistent=False)
        self.weight_casts += 1

    def _weight_fp8_t_target(self) -> torch.Tensor:
        """Where W^T's FP8 copy lives: this layer's buffer, or its columns of the unit's joint W^T (the copy the unit's
        backward reads). A move of the model (Module.to, _apply) replaces each buffer by its own copy, so the columns
        are taken from the joint buffer anew and made this layer's view again."""
        if self.joint is None:
            return self.weight_fp8_t
        unit, start = self.joint
        self.weight_fp8_t = unit.joint_weight_fp8_t[:, start : start + self.out_features]
        return self.weight_fp8_t

    @property
    def fp8_operands(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.weight_fp8, self.weight_fp8_t, self.weight_scale_inv

    def adapter_delta(self, x: torch.Tensor) -> torch.Tensor | None:
        """The adapters' contribution to this layer's output for input x; None without adapters."""
        if self.rank == 0:
            return None
        return self.adapter_output(self.dropout(x) @ self.lora_a.t())

    def adapter_output(self, low_rank: torch.Tensor) -> torch.Tensor:
        """The adapters' contribution from the rank-r product x A^T: scaled, then through B."""
        # The scale multiplies the rank-r product, not the output: a multiply of the output is a pass over it in the
        # backward too, and compiled, even `* 1.0` stays one where the gradient comes from a custom op (the frozen
        # FP8 q/k/v's). A scale of 1 (the default) multiplies nothing.
        if self.scale != 1.0:
            low_rank = low_rank * self.scale
        return low_rank @ self.lora_b.t()

    def with_adapter(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The base output y of input x, plus the adapters' contribution if this layer has adapters."""
        delta = self.adapter_delta(x)
        return y if delta is None else y + delta

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fp8:
            # Amaxes are recorded in training only: evaluation and sampling must not move delayed scales.
            y = _FrozenFp8Linears.apply(x, (self.scaling,), self.training, *self.fp8_operands)[0]
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
        return (self.weight.float().to(delta.device) + delta).to(self.weight.dtype)

    def extra_repr(self) -> str:
        base = f"in_features={self.in_features}, out_features={self.out_features}, frozen"
        adapters = f", lora rank {self.rank} scale {self.scale:g}" if self.rank else ""
        return base + (", fp8" if self.fp8 else "") + adapters


def projected_together(layers: tuple[FrozenLinear, ...]) -> list[FrozenLinear]:
    """The layers whose adapters adapter_deltas projects with one GEMM: those with adapters, when there are two or
    more and none has dropout; otherwise none."""
    adapted = [layer for layer in layers if layer.rank]
    if len(adapted) < 2 or any(not isinstance(layer.dropout, nn.Identity) for layer in adapted):
        return []
    return adapted


def adapter_gemm_widths(model: nn.Module) -> set[int]:
    """The rank-side widths of `model`'s adapter GEMMs: each adapter's rank, and the summed ranks of the adapters
    that adapter_deltas projects together."""
    widths = {m.rank for m in model.modules() if isinstance(m, FrozenLinear) and m.rank}
    for module in model.modules():
        if isinstance(module, (FrozenSharedInput, FrozenFp8QkvRope)):
            together = projected_together(module.linears)
            if together:
                widths.add(sum(layer.rank for layer in together))
    return widths


def adapter_deltas(layers: tuple[FrozenLinear, ...], x: torch.Tensor) -> list[torch.Tensor | None]:
    """FrozenLinear.adapter_delta of each of `layers`, which all read `x`. Their adapters' A projections run as one
    GEMM, x A_cat^T with A_cat their A matrices stacked, so that x is read once instead of once per adapter, and in
    the backward A's gradients are one GEMM (x read once more) and x's gradient through them one GEMM (written once)
    instead of one per adapter. Each output entry is the same dot product as alone. Adapters with dropout take
    their own masks of x, so layers with dropout go one by one."""
    adapted = projected_together(layers)
    if not adapted:
        return [layer.adapter_delta(x) for layer in layers]
    low_rank = x @ torch.cat([layer.lora_a for layer in adapted]).t()
    parts = iter(low_rank.split([layer.rank for layer in adapted], dim=-1))
    return [layer.adapter_output(next(parts)) if layer.rank else None for layer in layers]


class FrozenSharedInput(nn.Module):
    """Frozen linears that read one input (a model's SHARED_INPUT group, e.g. q/k/v): in FP8, the input cast once
    for all of them; with adapters, their A projections run as one GEMM (adapter_deltas). Each keeps its weight, its
    adapters, its scaling and its state-dict keys where the model has them; this module only refers to them."""

    def __init__(self, linears: tuple[FrozenLinear, ...]):
        super().__init__()
        self.linears = tuple(linears)  # not registered: they stay where the model has them
        self.fp8 = all(layer.fp8 for layer in self.linears)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.fp8:
            operands = [t for layer in self.linears for t in layer.fp8_operands]
            scalings = tuple(layer.scaling for layer in self.linears)
            outputs = _FrozenFp8Linears.apply(x, scalings, self.training, *operands)
        else:
            outputs = [nn.functional.linear(x, layer.weight) for layer in self.linears]
        deltas = adapter_deltas(self.linears, x)
        return tuple(y if delta is None else y + delta for y, delta in zip(outputs, deltas, strict=True))

    def extra_repr(self) -> str:
        what = "frozen FP8 linears sharing one input cast" if self.fp8 else "frozen linears sharing one input"
        together = ", their adapters' A projections as one GEMM" if projected_together(self.linears) else ""
        return f"{len(self.linears)} {what}{together}"


def join_fp8_weights_t(owner: nn.Module, linears: tuple[FrozenLinear, ...]) -> None:
    """Registers on `owner` the joint W^T of frozen FP8 `linears` that share an input (their FP8 W^T side by side:
    joint_dgrad's operand), each linear's `weight_fp8_t` becoming a view of its columns, so there is no second copy
    (FrozenLinear.refresh_fp8_weight writes into the joint buffer)."""
    owner.register_buffer("joint_weight_fp8_t", joint_columns([layer.weight_fp8_t for layer in linears]), False)
    start = 0
    for layer in linears:
        layer.joint = (owner, start)  # a tuple: the unit is not registered as the layer's submodule
        layer._weight_fp8_t_target()
        start += layer.out_features


class _FrozenFp8QkvRope(torch.autograd.Function):
    """(q, k, v) as (batch, heads, seq, head_dim), q and k rotated, from frozen FP8 q/k/v weights (cached operands as
    _FrozenFp8Linears'): x cast once; each output its base's FP8 GEMM plus its adapters' contribution (a `delta`
    computed outside by autograd, or None), then RoPE as the model applies it. In backward one kernel launch
    (rope_ops' rope_grad_cast_qkv) rotates attention's gradients back and writes each in FP8 as columns of one
    matrix, and where there is a delta also in BF16, as the delta's gradient; then one GEMM with the joint W^T gives
    dx (joint_dgrad_scales), where three GEMMs would each write a BF16 dx for a sum to read back. Unfused, RoPE's
    backward writes the BF16 gradient and a separate cast reads it back (see precision/fused/qkv_rope.py)."""

    @staticmethod
    def forward(ctx, x, delta_q, delta_k, delta_v, ops, rope, heads, positions, scalings, record, joint_t, *operands):
        batch, seq, _ = x.shape
        x_fp8, x_inv = scalings[0].cast(x.reshape(-1, x.shape[-1]), INPUT, record)
        deltas = (delta_q, delta_k, delta_v)
        outputs = []
        for (w_fp8, _, w_inv), delta, n in zip(_triples(operands), deltas, heads, strict=True):
            y = fp8_matmul(x_fp8, x_inv, w_fp8.t(), w_inv, fast_accum=True)
            if delta is not None:
                y = y + delta.reshape(y.shape)
            outputs.append(y.view(batch, seq, n, -1).transpose(1, 2))
        angles = None if positions is None else positions.unsqueeze(1)
        q, k, v = rope(outputs[0], angles), rope(outputs[1], angles), outputs[2]
        ctx.save_for_backward(positions, joint_t, *[w_inv for _, _, w_inv in _triples(operands)])
        ctx.ops, ctx.rope, ctx.scalings, ctx.record, ctx.n_operands = ops, rope, scalings, record, len(operands)
        ctx.has_delta = tuple(delta is not None for delta in deltas)
        return q, k, v

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        positions, joint_t, *w_invs = ctx.saved_tensors
        ops, rope, record = ctx.ops, ctx.rope, ctx.record
        batch, _, seq, _ = grads[0].shape
        unused = [None] * (7 + ctx.n_operands)
        if not ctx.needs_input_grad[0]:
            # The first block's x (the frozen embedding's, normed) needs no gradient: no base GEMM, so no FP8 cast and
            # no recording either (as for a group whose backward never runs); only the adapters' BF16 gradients.
            d_deltas = [
                rope_reference.rope_grad(grad, rope.cos, rope.sin, positions, i < 2).view(batch, seq, -1) if keep
                else None
                for i, (grad, keep) in enumerate(zip(grads, ctx.has_delta, strict=True))
            ]  # fmt: skip
            return None, *d_deltas, *unused
        scalings = ctx.scalings
        scales, _, joint_scales, joint_inv, recording, rows = qkv_grad_cast_args(
            ops, rope, positions, grads, scalings, w_invs, record
        )
        g_fp8, *kept = ops.rope_grad_cast_qkv(
            *grads, rope.cos, rope.sin, positions, scales, joint_scales, scalings[0].dtypes[GRAD], recording,
            list(ctx.has_delta), False, *rows,
        )  # fmt: skip
        dx = joint_dgrad(g_fp8, joint_inv, joint_t, scalings[0].fast_accum_backward)
        d_deltas = [g.view(batch, seq, -1) if keep else None for g, keep in zip(kept, ctx.has_delta, strict=True)]
        return dx.view(batch, seq, -1), *d_deltas, *unused


class FrozenFp8QkvRope(nn.Module):
    """Stands in for attention's frozen FP8 q/k/v projections and RoPE (a CausalSelfAttention's `qkv_rope`): the same
    FrozenLinears (weights, adapters, scalings and state-dict keys stay where the model has them), run as one unit
    with the attention's own RotaryEmbedding. Their FP8 W^T become columns of one joint W^T (a buffer here, each
    layer's `weight_fp8_t` a view of its columns: no second copy), the backward GEMM's operand."""

    def __init__(self, linears: tuple[FrozenLinear, ...], rope: RotaryEmbedding, heads: tuple[int, int, int]):
        super().__init__()
        self.linears = tuple(linears)  # not registered: they stay where the model has them
        self.rope = (rope,)  # not registered: the attention (and the model) owns it
        self.heads = heads
        self.ops = rope_ops(linears[0].weight_fp8.device)
        join_fp8_weights_t(self, self.linears)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """As Fp8QkvRope.forward."""
        if positions is not None:
            positions = positions.reshape(-1, x.shape[1]).contiguous()
        deltas = adapter_deltas(self.linears, x)
        operands = [t for layer in self.linears for t in layer.fp8_operands]
        scalings = tuple(layer.scaling for layer in self.linears)
        return _FrozenFp8QkvRope.apply(
            x, *deltas, self.ops, self.rope[0], self.heads, positions, scalings, self.training,
            self.joint_weight_fp8_t, *operands,
        )  # fmt: skip

    def extra_repr(self) -> str:
        return "frozen q/k/v projections and RoPE as one unit, fp8, gradients produced in FP8, dx in one GEMM"


class _FrozenFp8SwiGLU(torch.autograd.Function):
    """W2 (silu(W1 x) * W3 x) with frozen FP8 weights: x cast once, the activation g and the gradients dh1, dh3
    written in FP8 by the fused path's producer kernels (no transposes: there is no weight gradient), dh1 and dh3 side
    by side for one dx GEMM with W1 and W3's joint W^T (joint_dgrad). Scalings as the fused path's Fp8SwiGLU: w1's
    casts x and scales dh1, w3's dh3, w2's g and dy."""

    @staticmethod
    def forward(ctx, x, ops, scalings, record, joint_t, w1, w1_inv, w3, w3_inv, w2, w2_t, w2_inv):
        s1, _, s2 = scalings
        x_fp8, x_inv = s1.cast(x.reshape(-1, x.shape[-1]), INPUT, record)
        h1 = fp8_matmul(x_fp8, x_inv, w1.t(), w1_inv, fast_accum=True)
        h3 = fp8_matmul(x_fp8, x_inv, w3.t(), w3_inv, fast_accum=True)
        g_scale, (g_inv,) = produce_scales((s2,), INPUT, lambda: ops.swiglu_amax(h1, h3))
        rows = s2.producer_rows(INPUT, record, h1)
        g_fp8, _ = ops.swiglu_cast(h1, h3, g_scale, s2.dtypes[INPUT], record and s2.delayed, *rows, False)
        y = fp8_matmul(g_fp8, g_inv, w2.t(), w2_inv, fast_accum=True)
        ctx.save_for_backward(h1, h3, joint_t, w1_inv, w3_inv, w2_t, w2_inv)
        ctx.ops, ctx.scalings, ctx.record = ops, scalings, record
        return y.reshape(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, dy):
        h1, h3, joint_t, w1_inv, w3_inv, w2_t, w2_inv = ctx.saved_tensors
        ops, (s1, s3, s2), record = ctx.ops, ctx.scalings, ctx.record
        fast = s2.fast_accum_backward
        dy_fp8, dy_inv = s2.cast(dy.reshape(-1, dy.shape[-1]), GRAD, record)
        dg = fp8_matmul(dy_fp8, dy_inv, w2_t.t(), w2_inv, fast)
        dx, _, _ = swiglu_input_gradient(ops, dg, h1, h3, (s1, s3), (w1_inv, w3_inv), joint_t, record, fast, False)
        return dx.reshape(*dy.shape[:-1], dx.shape[-1]), *([None] * 11)


class FrozenFp8SwiGLU(nn.Module):
    """Stands in for a SwiGLU block whose three linears are frozen FP8 FrozenLinears without adapters: the same
    w1, w2, w3 (same state-dict keys), run as one FP8 block. W1 and W3's FP8 W^T are columns of one joint W^T
    (join_fp8_weights_t), the backward GEMM's operand."""

    def __init__(self, w1: FrozenLinear, w2: FrozenLinear, w3: FrozenLinear):
        super().__init__()
        self.w1, self.w2, self.w3 = w1, w2, w3
        self.ops = swiglu_ops(w1.weight.device)
        join_fp8_weights_t(self, (w1, w3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w1, w3, w2 = (self.w1.fp8_operands, self.w3.fp8_operands, self.w2.fp8_operands)
        scalings = (self.w1.scaling, self.w3.scaling, self.w2.scaling)
        return _FrozenFp8SwiGLU.apply(
            x, self.ops, scalings, self.training, self.joint_weight_fp8_t, w1[0], w1[2], w3[0], w3[2], *w2
        )

    def extra_repr(self) -> str:
        return "frozen, fp8, activation and its gradients produced in FP8, dx in one GEMM"


class _FrozenFp8LinearCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of x W^T with a frozen FP8 head: the logits' gradient written in FP8 where it is computed
    (precision/fused/head.py says why no amax pass is needed), the logits made a block of rows at a time so that the
    whole BF16 logits never sit beside it; one backward GEMM (dx) per block."""

    @staticmethod
    def forward(ctx, x, targets, scaling: SiteScaling, record: bool, w_fp8, w_t, w_scale_inv):
        x_fp8, x_scale_inv = scaling.cast(x.reshape(-1, x.shape[-1]), INPUT, record)
        loss, grads, count = loss_and_unit_grads_by_rows(
            x_fp8, x_scale_inv, w_fp8, w_scale_inv, targets.reshape(-1), scaling.dtypes[GRAD]
        )
        ctx.save_for_backward(count, w_t, w_scale_inv, *grads)
        ctx.scaling, ctx.x_shape = scaling, x.shape
        return loss

    @staticmethod
    def backward(ctx, dloss):
        count, w_t, w_scale_inv, *grads = ctx.saved_tensors
        scaling = ctx.scaling
        g_scale_inv = logits_grad_scale_inv(dloss, count, scaling.dtypes[GRAD])
        dx = torch.cat([fp8_matmul(g, g_scale_inv, w_t.t(), w_scale_inv, scaling.fast_accum_backward) for g in grads])
        return dx.reshape(ctx.x_shape), None, None, None, None, None, None


class FrozenFp8LMHead(FrozenLinear):
    """The frozen FP8 lm_head (without adapters), which also computes the model's loss with its GEMM."""

    def linear_cross_entropy(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of `targets` under x W^T; the same value as cross_entropy(self(x), targets)."""
        if not torch.is_grad_enabled():
            return loss_without_gradient(self, x, targets)
        return _FrozenFp8LinearCrossEntropy.apply(x, targets, self.scaling, self.training, *self.fp8_operands)
