"""Building blocks shared by every transformer block: RMSNorm, rotary embeddings, SwiGLU, weight init."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The mean of squares overflows or loses precision in bf16, so normalise in fp32 and cast once.
        out = F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps)
        return out.to(x.dtype)


class RotaryEmbedding(nn.Module):
    """RoPE with the CS336 convention: channels (2i, 2i+1) form a pair rotated by pos * theta^(-2i/d).

    This differs from the "rotate_half" convention (pairs i and i + d/2), so weights trained with one
    convention do not transfer to the other without permuting q/k projection rows.
    """

    def __init__(self, head_dim: int, max_seq_len: int, theta: float = 10000.0) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE rotates pairs of channels, so head_dim must be even, got {head_dim}.")
        self.head_dim = head_dim
        self.max_seq_len = max_seq_len
        self.theta = theta
        cos, sin = self._tables(torch.get_default_device())
        # Non-persistent: the tables are a pure function of the config, so they stay out of checkpoints.
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def _tables(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        # Angles reach max_seq_len radians; float64 keeps them exact before rounding to fp32 once. Computed on the CPU
        # for any real device; on "meta" (a model built for its shapes alone) as shapes only, taking no memory.
        at = device if device.type == "meta" else torch.device("cpu")
        inv_freq = self.theta ** (-torch.arange(0, self.head_dim, 2, dtype=torch.float64, device=at) / self.head_dim)
        angles = torch.outer(torch.arange(self.max_seq_len, dtype=torch.float64, device=at), inv_freq)
        return angles.cos().float().to(device), angles.sin().float().to(device)

    def _apply(self, fn, recurse=True):
        # model.to(torch.bfloat16) would round the tables to 8 mantissa bits and to_empty() would leave
        # them uninitialised; rebuilding them wherever they landed keeps them exact fp32 in both cases.
        super()._apply(fn, recurse)
        self.cos, self.sin = self._tables(self.cos.device)
        return self

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """x: (..., seq, head_dim); positions: integer, of a shape that broadcasts to x.shape[:-1] (so (seq,),
        or x's leading dims + (seq,) with any of them 1); None means 0..seq-1.

        Broadcasting aligns trailing dims, so a caller whose x has axes the positions lack (heads) must give
        the positions those axes (size 1) itself; shapes that would enlarge x are refused.
        """
        seq = x.shape[-2]
        if positions is None:
            if seq > self.max_seq_len:
                raise ValueError(f"sequence of {seq} positions is longer than RoPE's max_seq_len {self.max_seq_len}.")
            cos, sin = self.cos[:seq], self.sin[:seq]
        else:
            if positions.shape[-1:] != (seq,) or _broadcast_shape(positions.shape, x.shape[:-1]) != x.shape[:-1]:
                raise ValueError(
                    f"RoPE positions of shape {tuple(positions.shape)} do not fit x of shape {tuple(x.shape)}: they "
                    f"must end in the sequence length {seq} and broadcast to {tuple(x.shape[:-1])}."
                )
            cos, sin = self.cos[positions], self.sin[positions]
        x1, x2 = x.float().unflatten(-1, (-1, 2)).unbind(-1)
        rotated = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
        return rotated.flatten(-2).to(x.dtype)


def _broadcast_shape(a: torch.Size, b: torch.Size) -> torch.Size | None:
    try:
        return torch.broadcast_shapes(a, b)
    except RuntimeError:
        return None


class SwiGLU(nn.Module):
    # Linear layers that read the same input: a precision conversion may run them through one joint module (set as
    # the attribute named here), e.g. to cast their shared input once. The layers keep their own weights.
    SHARED_INPUT = {"w13": ("w1", "w3")}

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        # Plain nn.Linear so that TorchAO's FP8 conversion (which swaps nn.Linear modules) reaches them.
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w13: nn.Module | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h1, h3 = self.w13(x) if self.w13 is not None else (self.w1(x), self.w3(x))
        return self.w2(F.silu(h1) * h3)


def init_weights(model: nn.Module) -> None:
    """Initialise weights with the CS336 convention.

    - nn.Linear: truncated normal, mean 0, std sqrt(2 / (in + out)), cut at +-3 std. This is Xavier/Glorot
      variance, which keeps activations and gradients at roughly unit scale through each matmul in both
      directions; truncation removes the rare huge weights that cause early loss spikes.
    - nn.Embedding: truncated N(0, 1) cut at +-3. Each row is looked up, never summed over, so unit scale
      is right; the pre-norm blocks rescale what they read anyway.
    - RMSNorm: weight 1, so each norm starts as a pure normalisation.

    Linear layers are initialised after embeddings on purpose: with tied embeddings the shared matrix
    gets the lm_head's small init, because N(0, 1) output weights would give logits of std sqrt(dim)
    and a first loss far above log(vocab).
    """
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            nn.init.trunc_normal_(module.weight, mean=0.0, std=1.0, a=-3.0, b=3.0)
        elif isinstance(module, RMSNorm):
            nn.init.ones_(module.weight)
    for module in model.modules():
        if isinstance(module, nn.Linear):
            std = math.sqrt(2.0 / (module.in_features + module.out_features))
            nn.init.trunc_normal_(module.weight, mean=0.0, std=std, a=-3.0 * std, b=3.0 * std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
