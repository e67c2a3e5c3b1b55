"""Stateless pieces of the model: softmax, SiLU, cross-entropy and masked scaled dot-product attention.

The model uses these (its loss is ``cross_entropy``, its ``math`` attention backend is
``scaled_dot_product_attention``), and they are the course's functions of the same names.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = ["cross_entropy", "scaled_dot_product_attention", "silu", "softmax"]

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half-precision inputs (whose exp/sum would lose too much), else the input's own dtype."""
    return torch.float32 if dtype in _LOW_PRECISION else dtype


def softmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Softmax along ``dim``; the maximum is subtracted first, so large inputs do not overflow."""
    return torch.softmax(x, dim=dim)


def silu(x: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(x)."""
    return F.silu(x)


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood of ``targets`` (...,) under ``logits`` (..., vocab), over all batch dims.

    Computed as log-sum-exp minus the target logit (never exp of raw logits), in float32 for half-precision
    logits, so large logits are fine. A target of -100 is ignored (torch's ``ignore_index``); any other id
    outside the vocabulary is an error.
    """
    logits = logits.to(_compute_dtype(logits.dtype))
    return F.cross_entropy(logits.flatten(0, -2), targets.flatten())


def scaled_dot_product_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """softmax(q k^T / sqrt(d_k)) v, with any leading batch dims: q (..., queries, d_k), k (..., keys, d_k),
    v (..., keys, d_v) -> (..., queries, d_v).

    ``mask`` is boolean, broadcastable to (..., queries, keys), True where a query may attend to a key.
    A query that may attend to nothing gets NaN, as the formula says (a softmax over no entries).
    Computed explicitly (in float32 for half-precision inputs): the reference the fused kernels are tested
    against.
    """
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError(f"the attention mask must be boolean (True = may attend), got {mask.dtype}.")
    dtype = _compute_dtype(q.dtype)
    scores = (q.to(dtype) @ k.to(dtype).transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return (softmax(scores, dim=-1) @ v.to(dtype)).to(q.dtype)
