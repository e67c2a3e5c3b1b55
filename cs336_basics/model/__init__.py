"""The transformer LM and its parts."""

from cs336_basics.model.attention import CausalSelfAttention, causal_attention, check_attention_backend
from cs336_basics.model.layers import RMSNorm, RotaryEmbedding, SwiGLU, init_weights
from cs336_basics.model.transformer import TransformerBlock, TransformerLM

__all__ = [
    "CausalSelfAttention",
    "RMSNorm",
    "RotaryEmbedding",
    "SwiGLU",
    "TransformerBlock",
    "TransformerLM",
    "causal_attention",
    "check_attention_backend",
    "init_weights",
]
