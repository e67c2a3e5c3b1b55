"""Causal self-attention with three interchangeable kernels: SDPA, flash-attn, and an explicit reference."""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from cs336_basics.config import ATTENTION_BACKENDS, ModelConfig
from cs336_basics.errors import ConfigError, NotSupportedHere
from cs336_basics.model.functional import scaled_dot_product_attention
from cs336_basics.model.layers import RotaryEmbedding

try:  # flash-attn is an opt-in CUDA build (`uv sync --extra flash`); without it "flash" falls back to SDPA.
    import flash_attn
    from flash_attn import flash_attn_func
except ImportError:
    flash_attn = None
    flash_attn_func = None

_FLASH_SDPA_KERNELS = [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION]


def _repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(batch, n_kv_heads, seq, d) -> (batch, n_kv_heads * n_rep, seq, d); query head h reads K/V head h // n_rep."""
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1)


def _math_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    n_rep = q.shape[1] // k.shape[1]
    k, v = _repeat_kv(k, n_rep), _repeat_kv(v, n_rep)
    seq = q.shape[-2]
    past_and_present = torch.ones(seq, seq, dtype=torch.bool, device=q.device).tril()
    return scaled_dot_product_attention(q, k, v, past_and_present)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: str = "sdpa") -> torch.Tensor:
    """q: (batch, n_heads, seq, d); k, v: (batch, n_kv_heads, seq, d) -> (batch, n_heads, seq, d)."""
    gqa = k.shape[1] != q.shape[1]
    if backend == "sdpa":
        # enable_gqa=True restricts which kernels SDPA may pick, so ask for it only when it is needed.
        extra = {"enable_gqa": True} if gqa else {}
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, **extra)
    if backend == "flash":
        if flash_attn_func is not None and q.is_cuda:
            out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True)
            return out.transpose(1, 2)
        # The flash and cuDNN kernels may reject enable_gqa, so give them one K/V head per query head.
        n_rep = q.shape[1] // k.shape[1]
        k, v = _repeat_kv(k, n_rep), _repeat_kv(v, n_rep)
        with sdpa_kernel(_FLASH_SDPA_KERNELS):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if backend == "math":
        return _math_attention(q, k, v)
    raise ConfigError(f"attention backend must be one of {ATTENTION_BACKENDS}, got {backend!r}.")


def check_attention_backend(backend: str, device: torch.device, dtype: torch.dtype, *, head_dim: int = 64) -> str:
    """Fail before training if `backend` cannot run here; return a short description of the kernel used.

    head_dim only shapes the probe call; pass the model's if you have it, since kernels limit it.
    """
    device = torch.device(device)
    if backend == "sdpa":
        return "SDPA (PyTorch picks the kernel)"
    if backend == "math":
        return "math (explicit softmax reference)"
    if backend != "flash":
        raise ConfigError(f"attention backend must be one of {ATTENTION_BACKENDS}, got {backend!r}.")
    if device.type != "cuda":
        raise NotSupportedHere(
            f"flash attention needs a CUDA GPU; this run is on {device.type}. "
            "Use --attention sdpa (the default), which picks the best kernel this machine has."
        )
    if dtype not in (torch.bfloat16, torch.float16):
        raise NotSupportedHere(
            f"flash attention kernels need half precision (bfloat16 or float16), but attention would run "
            f"in {dtype}. Train in bfloat16, or use --attention sdpa (the default)."
        )
    description = (
        f"flash-attn {flash_attn.__version__}" if flash_attn is not None else "SDPA (flash/cuDNN kernels only)"
    )
    # SDPA reports why each kernel was rejected only as warnings, so record them for the error message.
    q = torch.randn(1, 2, 16, head_dim, device=device, dtype=dtype)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            causal_attention(q, q, q, "flash")
        except RuntimeError as e:
            reasons = "; ".join(str(w.message) for w in caught)
            raise NotSupportedHere(
                f"flash attention cannot run on this GPU with {dtype} and head_dim {head_dim} "
                f"({description}): {e} {reasons}".rstrip()
                + " Install flash-attn (`uv sync --extra flash`) or use --attention sdpa (the default)."
            ) from e
    return description


class CausalSelfAttention(nn.Module):
    """Causal multi-head (or grouped-query) self-attention, with RoPE on q and k unless use_rope=False."""

    # q, k and v read the same input: a precision conversion may run them through one joint module set as `qkv`
    # (e.g. to cast the input once), the layers keeping their own weights (and state-dict keys).
    SHARED_INPUT = {"qkv": ("q_proj", "k_proj", "v_proj")}
    # Such a module may also take over RoPE, set as `qkv_rope` instead (e.g. so that RoPE's backward writes q's and k's
    # gradients in a conversion's own format): called as qkv_rope(x, positions), it returns q, k (rotated by this
    # layer's rope) and v as (batch, heads, seq, head_dim).

    def __init__(self, config: ModelConfig, rope: RotaryEmbedding | None = None, *, use_rope: bool = True) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.n_kv_heads = config.kv_heads
        self.head_dim = config.head_dim
        self.backend = config.attention
        # Plain nn.Linear (never F.linear on raw parameters): TorchAO's FP8 conversion swaps exactly these.
        self.q_proj = nn.Linear(config.dim, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.output_proj = nn.Linear(self.n_heads * self.head_dim, config.dim, bias=False)
        self.qkv: nn.Module | None = None  # see SHARED_INPUT
        self.qkv_rope: nn.Module | None = None
        # The LM passes one shared instance to every layer; a standalone module builds its own.
        if rope is None and use_rope:
            rope = RotaryEmbedding(self.head_dim, config.context_length, config.rope_theta)
        self.rope = rope if use_rope else None

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """x: (batch, seq, dim); positions: None (0..seq-1), (seq,), or (batch or 1, seq), one row per sequence."""
        batch, seq, _ = x.shape
        if positions is not None:
            if self.rope is None:
                raise ValueError("this attention has no RoPE, so token positions would have no effect; pass none.")
            if positions.ndim not in (1, 2):
                raise ValueError(
                    f"attention positions must be (seq,) or (batch, seq); got shape {tuple(positions.shape)} "
                    f"for x of shape {tuple(x.shape)}."
                )
        if self.qkv_rope is not None:
            q, k, v = self.qkv_rope(x, positions)
        else:
            q, k, v = self.qkv(x) if self.qkv is not None else (self.q_proj(x), self.k_proj(x), self.v_proj(x))
            q = q.view(batch, seq, self.n_heads, self.head_dim).transpose(1, 2)
            k = k.view(batch, seq, self.n_kv_heads, self.head_dim).transpose(1, 2)
            v = v.view(batch, seq, self.n_kv_heads, self.head_dim).transpose(1, 2)
            if self.rope is not None:
                # q and k are (batch, heads, seq, d): without a head axis, (batch, seq) positions would align their
                # batch axis with the heads (silently wrong when batch == heads).
                heads_axis = positions.unsqueeze(1) if positions is not None and positions.ndim == 2 else positions
                q, k = self.rope(q, heads_axis), self.rope(k, heads_axis)
        out = causal_attention(q, k, v, self.backend)
        return self.output_proj(out.transpose(1, 2).reshape(batch, seq, self.n_heads * self.head_dim))
