"""The q/k/v gradients' FP8 producer in plain torch: the definition the Triton kernel (rope_triton.py) must match, and
the implementation on CPU (FP8 emulation).

Attention hands back the gradients of q, k (after RoPE) and v as (batch, heads, seq, head_dim) tensors of any
strides. The projections' backward GEMMs want each as a row-major (tokens, heads * head_dim) FP8 tensor plus its
transpose; for q and k, RoPE's backward comes first (the rotation by the opposite angle). Two operations, the same
names and signatures in both modules:
- `rope_grad_amax(grad, cos, sin, positions, rotate)` -> amax (1,) of the gradient to cast: dynamic scaling's first
  pass;
- `rope_grad_cast(grad, cos, sin, positions, scale, dtype, record, rotate)` -> (the gradient in FP8, its transpose
  in FP8, amax per token row (tokens,), saturated values per token row (tokens,)); without `record` (dynamic scaling)
  the two recordings are empty. `scale` has shape (1,).

`rotate` says whether RoPE's backward applies (q, k) or not (v). `cos` and `sin` are RotaryEmbedding's float32
tables (max_seq_len, head_dim / 2); `positions` is None (0..seq-1) or integer (batch or 1, seq). The rotated gradient
is rounded to BF16 where autograd of RotaryEmbedding.forward in a BF16 model rounds it, so the FP8 tensors are the
casts of the BF16 gradients the unfused path would have written, and its per-row recordings are those of
SiteScaling.cast.
"""

from __future__ import annotations

import torch

from cs336_basics.precision.fused.scaling import cast_to_fp8, fp8_max


def rope_grad(
    grad: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor | None, rotate: bool
) -> torch.Tensor:
    """The gradient of the projection's output, (tokens, heads * head_dim) in grad's dtype: grad rotated back by RoPE's
    angle (if `rotate`) and laid out token-major."""
    batch, heads, seq, head_dim = grad.shape
    if rotate:
        angles = (slice(None, seq),) if positions is None else (positions[:, None, :],)
        c, s = cos[angles], sin[angles]
        g1, g2 = grad.float().unflatten(-1, (-1, 2)).unbind(-1)
        # RoPE's forward is (x1 c - x2 s, x1 s + x2 c) per channel pair; its backward the transposed rotation.
        grad = torch.stack((g1 * c + g2 * s, g2 * c - g1 * s), dim=-1).flatten(-2).to(grad.dtype)
    return grad.transpose(1, 2).reshape(batch * seq, heads * head_dim)


def rope_grad_amax(
    grad: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor | None, rotate: bool
) -> torch.Tensor:
    return rope_grad(grad, cos, sin, positions, rotate).abs().amax().float().reshape(1)


def rope_grad_cast(
    grad: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor | None,
    scale: torch.Tensor,
    dtype: torch.dtype,
    record: bool,
    rotate: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = rope_grad(grad, cos, sin, positions, rotate)
    g_fp8 = cast_to_fp8(g, scale[0], dtype)
    if not record:
        empty = scale.new_empty(0)
        return g_fp8, g_fp8.t().contiguous(), empty, empty.to(torch.int32)
    magnitude = g.abs().float()
    saturated = (magnitude * scale[0] > fp8_max(dtype)).sum(dim=-1, dtype=torch.int32)
    return g_fp8, g_fp8.t().contiguous(), magnitude.amax(dim=-1), saturated
