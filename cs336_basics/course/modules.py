"""The course's modules, built from the course's constructor arguments, over this package's own layers.

Each class subclasses the module the LM is made of (or torch's ``nn.Linear`` / ``nn.Embedding``), so the
numerics, the state-dict keys and the FP8 conversion are those of the real model: every linear inside is
an ``nn.Linear``, which TorchAO's ``convert_to_float8_training`` swaps. Weights start with the course's
initialisation (``init_weights``). ``device`` and ``dtype`` place the parameters, as in the course.
"""

from __future__ import annotations

import torch
from torch import nn

from cs336_basics.config import ModelConfig
from cs336_basics.model import attention, layers, transformer

__all__ = [
    "Embedding",
    "Linear",
    "MultiHeadSelfAttention",
    "RMSNorm",
    "RotaryPositionalEmbedding",
    "SwiGLU",
    "TransformerBlock",
    "TransformerLM",
]

Device = torch.device | str | None


def _config(d_model: int, num_heads: int, **fields) -> ModelConfig:
    """A ModelConfig for a part of the LM; the fields a part does not use get placeholder sizes of 1."""
    defaults = {"vocab_size": 1, "context_length": 1, "n_layers": 1, "intermediate_size": 1}
    return ModelConfig(dim=d_model, n_heads=num_heads, **(defaults | fields))


class Linear(nn.Linear):
    """y = x W^T with W of shape (out_features, in_features), no bias."""

    def __init__(self, in_features: int, out_features: int, device: Device = None, dtype: torch.dtype | None = None):
        super().__init__(in_features, out_features, bias=False, device=device, dtype=dtype)
        layers.init_weights(self)


class Embedding(nn.Embedding):
    """Lookup of rows of a (num_embeddings, embedding_dim) table."""

    def __init__(
        self, num_embeddings: int, embedding_dim: int, device: Device = None, dtype: torch.dtype | None = None
    ):
        super().__init__(num_embeddings, embedding_dim, device=device, dtype=dtype)
        layers.init_weights(self)


class RMSNorm(layers.RMSNorm):
    """x / sqrt(mean(x^2) + eps) * weight over the last dim, computed in float32."""

    def __init__(self, d_model: int, eps: float = 1e-5, device: Device = None, dtype: torch.dtype | None = None):
        super().__init__(d_model, eps)
        self.to(device=device, dtype=dtype)


class SwiGLU(layers.SwiGLU):
    """w2(silu(w1 x) * w3 x), with w1, w3: d_model -> d_ff and w2: d_ff -> d_model."""

    def __init__(self, d_model: int, d_ff: int, device: Device = None, dtype: torch.dtype | None = None):
        super().__init__(d_model, d_ff)
        layers.init_weights(self)
        self.to(device=device, dtype=dtype)


class RotaryPositionalEmbedding(layers.RotaryEmbedding):
    """RoPE on channel pairs (2i, 2i+1) with angle position * theta^(-2i/d_k); no trainable state."""

    def __init__(self, theta: float, d_k: int, max_seq_len: int, device: Device = None):
        super().__init__(d_k, max_seq_len, theta)
        self.to(device=device)

    def forward(self, x: torch.Tensor, token_positions: torch.Tensor | None = None) -> torch.Tensor:
        """x: (..., seq, d_k); token_positions: (..., seq), broadcastable to x's leading dims; None: 0..seq-1."""
        return super().forward(x, token_positions)


class MultiHeadSelfAttention(attention.CausalSelfAttention):
    """Causal multi-head self-attention; with ``max_seq_len`` and ``theta``, RoPE is applied to q and k.

    Keys: q_proj, k_proj, v_proj, output_proj (each (d_model, d_model)).
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        max_seq_len: int | None = None,
        theta: float | None = None,
        device: Device = None,
        dtype: torch.dtype | None = None,
    ):
        if (max_seq_len is None) != (theta is None):
            raise ValueError("RoPE needs both max_seq_len and theta; pass both, or neither for attention without it.")
        use_rope = theta is not None
        rope_fields = {"context_length": max_seq_len, "rope_theta": theta} if use_rope else {}
        super().__init__(_config(d_model, num_heads, **rope_fields), use_rope=use_rope)
        layers.init_weights(self)
        self.to(device=device, dtype=dtype)

    def forward(self, x: torch.Tensor, token_positions: torch.Tensor | None = None) -> torch.Tensor:
        """x: (..., seq, d_model) -> (..., seq, d_model). token_positions (RoPE only): (seq,) or (..., seq)
        broadcastable to x's leading dims; None means 0..seq-1."""
        *lead, seq, d_model = x.shape
        positions = token_positions
        if positions is not None and positions.ndim > 1:
            try:
                positions = positions.broadcast_to((*lead, seq))
            except RuntimeError as e:
                raise ValueError(
                    f"token_positions of shape {tuple(positions.shape)} do not broadcast to x's leading dims and "
                    f"sequence length {(*lead, seq)}."
                ) from e
            positions = positions.reshape(-1, seq)
        out = super().forward(x.reshape(-1, seq, d_model), positions)
        return out.reshape(x.shape)


class TransformerBlock(transformer.TransformerBlock):
    """Pre-norm block: x + attn(ln1(x)), then + ffn(ln2(x)). Keys: ln1, attn, ln2, ffn."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        max_seq_len: int,
        theta: float,
        device: Device = None,
        dtype: torch.dtype | None = None,
    ):
        config = _config(d_model, num_heads, intermediate_size=d_ff, context_length=max_seq_len, rope_theta=theta)
        super().__init__(config)
        layers.init_weights(self)
        self.to(device=device, dtype=dtype)


class TransformerLM(transformer.TransformerLM):
    """The decoder-only LM; forward(in_indices (batch, seq)) -> logits (batch, seq, vocab_size).

    Keys: token_embeddings, layers.{i}, ln_final, lm_head.
    """

    def __init__(
        self,
        vocab_size: int,
        context_length: int,
        d_model: int,
        num_layers: int,
        num_heads: int,
        d_ff: int,
        rope_theta: float,
        device: Device = None,
        dtype: torch.dtype | None = None,
    ):
        config = ModelConfig(
            vocab_size=vocab_size, context_length=context_length, dim=d_model, n_layers=num_layers,
            n_heads=num_heads, intermediate_size=d_ff, rope_theta=rope_theta,
        )  # fmt: skip
        super().__init__(config)
        self.to(device=device, dtype=dtype)
