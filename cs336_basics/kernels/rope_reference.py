"""The q/k/v gradients' FP8 producer in plain torch: the definition the Triton kernel (rope_triton.py) must match, and
the implementation on CPU (FP8 emulation).

Attention hands back the gradients of q, k (after RoPE) and v as (batch, heads, seq, head_dim) tensors of any
strides. The projections' backward GEMMs want each as a row-major (tokens, heads * head_dim) FP8 tensor plus its
transpose; for q and k, RoPE's backward comes first (the rotation by the opposite angle). Two operations, the same
names and signatures in both modules:
- `rope_grad_amax(grad, cos, sin, positions, rotate)` -> amax (1,) of the gradient to cast: dynamic scaling's first
  pass;
- `rope_grad_cast_qkv(grad_q, grad_k, grad_v, cos, sin, positions, scales, joint_scales, dtype, record, keep_bf16,
  transposed, amax_q, saturated_q, amax_k, saturated_k, amax_v, saturated_v)` -> (the three gradients in FP8 side by
  side, the columns of one (tokens, channels summed) matrix, gradient i cast by `joint_scales[i]`: the operand of one
  input-gradient GEMM over the three (linear.joint_dgrad_scales); then one second output per gradient: its (channels,
  tokens) FP8 transpose by its site's own scale `scales[i]` if `transposed`, for its weight-gradient GEMM; else its
  rotated gradient in its dtype where `keep_bf16[i]`, for a frozen base's adapters (lora/layers.py); else an empty
  tensor). With `record` (delayed scaling) it also files, against `scales[i]`, in place,
  each token row's amax and count of saturated values into the site's row buffers (`amax_q`, `saturated_q`, ...;
  max-accumulated and added; row r into entry r modulo their length: the update reduces each buffer to one number),
  as SiteScaling.cast does for the casts it runs itself; without it they are not touched.

`rotate` says whether RoPE's backward applies (q, k) or not (v); rope_grad_cast_qkv rotates q's and k's. `cos` and
`sin` are RotaryEmbedding's float32 tables (max_seq_len, head_dim / 2); `positions` is None (0..seq-1) or integer
(batch or 1, seq). The rotated gradient is rounded to BF16 where autograd of RotaryEmbedding.forward in a BF16 model
rounds it, so the FP8 tensors are the casts of the BF16 gradients the unfused path would have written.
"""

from __future__ import annotations

import torch

from cs336_basics.kernels.fp8_format import cast_to_fp8, fp8_max


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


def _record(g, scale, dtype, record, amax_rows, saturated_rows) -> None:
    """Delayed scaling's recordings of g (tokens, channels) cast by `scale`, if `record`."""
    if record:
        magnitude = g.abs().float()
        entry = torch.arange(g.shape[0], device=g.device) % amax_rows.numel()
        amax_rows.scatter_reduce_(0, entry, magnitude.amax(dim=-1), "amax")
        saturated_rows.scatter_add_(0, entry, (magnitude * scale[0] > fp8_max(dtype)).sum(dim=-1, dtype=torch.int32))


def _rope_grad_cast_one(
    grad: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor | None,
    scale: torch.Tensor,
    joint_scale: torch.Tensor,
    dtype: torch.dtype,
    rotate: bool,
    record: bool,
    keep_bf16: bool,
    transposed: bool,
    amax_rows: torch.Tensor,
    saturated_rows: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One gradient of rope_grad_cast_qkv: (its FP8 cast by `joint_scale`, its second output)."""
    g = rope_grad(grad, cos, sin, positions, rotate)
    _record(g, scale, dtype, record, amax_rows, saturated_rows)
    g_fp8 = cast_to_fp8(g, joint_scale[0], dtype)
    if transposed:
        return g_fp8, cast_to_fp8(g, scale[0], dtype).t().contiguous()
    return g_fp8, g if keep_bf16 else grad.new_empty(0)


def rope_grad_cast_qkv(
    grad_q: torch.Tensor,
    grad_k: torch.Tensor,
    grad_v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor | None,
    scales: torch.Tensor,
    joint_scales: torch.Tensor,
    dtype: torch.dtype,
    record: bool,
    keep_bf16: list[bool],
    transposed: bool,
    amax_q: torch.Tensor,
    saturated_q: torch.Tensor,
    amax_k: torch.Tensor,
    saturated_k: torch.Tensor,
    amax_v: torch.Tensor,
    saturated_v: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    check_second_outputs(keep_bf16, transposed)
    rows = ((amax_q, saturated_q), (amax_k, saturated_k), (amax_v, saturated_v))
    parts = [
        _rope_grad_cast_one(
            grad,
            cos,
            sin,
            positions,
            scales[i : i + 1],
            joint_scales[i : i + 1],
            dtype,
            i < 2,
            record,
            keep_bf16[i],
            transposed,
            *rows[i],
        )
        for i, grad in enumerate((grad_q, grad_k, grad_v))
    ]
    return torch.cat([g_fp8 for g_fp8, _ in parts], dim=1), *[second for _, second in parts]


def check_second_outputs(keep_bf16: list[bool], transposed: bool) -> None:
    """The kernel writes one second output per gradient: its transpose or its BF16 copy, not both."""
    if transposed and any(keep_bf16):
        raise ValueError("rope_grad_cast_qkv writes either the transposes or the BF16 gradients, not both")
