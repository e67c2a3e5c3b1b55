"""The decoder-only transformer LM (pre-norm, RoPE, SwiGLU), laid out exactly like the CS336 state dict."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from cs336_basics.config import ModelConfig
from cs336_basics.model.attention import CausalSelfAttention
from cs336_basics.model.functional import cross_entropy
from cs336_basics.model.layers import RMSNorm, RotaryEmbedding, SwiGLU, init_weights


class TransformerBlock(nn.Module):
    def __init__(self, config: ModelConfig, rope: RotaryEmbedding | None = None) -> None:
        super().__init__()
        self.ln1 = RMSNorm(config.dim, config.norm_eps)
        self.attn = CausalSelfAttention(config, rope)
        self.ln2 = RMSNorm(config.dim, config.norm_eps)
        self.ffn = SwiGLU(config.dim, config.intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.ffn(self.ln2(x))


class TransformerLM(nn.Module):
    def __init__(self, config: ModelConfig, *, init: bool = True) -> None:
        """`init=False` leaves the weights as allocated: a skeleton of the model's modules and shapes (an analysis
        builds one under FakeTensorMode, where the course init's data-dependent truncated normal cannot run)."""
        super().__init__()
        self.config = config
        self.token_embeddings = nn.Embedding(config.vocab_size, config.dim)
        # One table for all layers; its buffers are non-persistent, so sharing adds no state dict keys.
        rope = RotaryEmbedding(config.head_dim, config.context_length, config.rope_theta)
        self.layers = nn.ModuleList(TransformerBlock(config, rope) for _ in range(config.n_layers))
        self.ln_final = RMSNorm(config.dim, config.norm_eps)
        self.lm_head = nn.Linear(config.dim, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.token_embeddings.weight
        if init:
            init_weights(self)

    def forward(self, input_ids: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids: (batch, seq). Returns logits (batch, seq, vocab), or the mean loss if targets is given.

        Targets equal to -100 are ignored (F.cross_entropy's default ignore_index).
        """
        seq = input_ids.shape[-1]
        if seq > self.config.context_length:
            raise ValueError(
                f"input has {seq} tokens but the model's context_length is {self.config.context_length}; "
                "crop or split the sequence."
            )
        x = self.token_embeddings(input_ids)
        recompute = self.config.gradient_checkpointing and self.training and torch.is_grad_enabled()
        for block in self.layers:
            x = checkpoint(block, x, use_reentrant=False) if recompute else block(x)
        return self.output(x, targets)

    def output(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """The last block's output to logits, or to the mean loss if targets is given."""
        x = self.ln_final(x)
        if targets is None:
            return self.lm_head(x)
        # A converted head may compute the loss with its GEMM (the fused FP8 path's head casts the logits'
        # gradient where it computes it: precision/fused/head.py).
        fused_loss = getattr(self.lm_head, "linear_cross_entropy", None)
        if fused_loss is not None:
            return fused_loss(x, targets)
        # Computing the loss here lets torch.compile fuse the fp32 upcast into the loss kernel, so the
        # full fp32 logits never have to be materialised.
        return cross_entropy(self.lm_head(x), targets)

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        """Parameter count (shared tensors once). exclude_embeddings drops only the input lookup table:
        the lm_head is a real matmul, so with tied weights nothing is dropped."""
        total = sum(p.numel() for p in self.parameters())
        if exclude_embeddings and not self.config.tie_embeddings:
            total -= self.token_embeddings.weight.numel()
        return total

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, **sampling) -> torch.Tensor:
        """sample_tokens from this model, at its context length (`sampling`: its keyword arguments)."""
        return sample_tokens(self, self.config.context_length, input_ids, max_new_tokens, **sampling)


def sample_tokens(
    model: nn.Module,
    context_length: int,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    eos_token_id: int | None = None,
    generator: torch.Generator | None = None,
    top_k: int = 0,
) -> torch.Tensor:
    """Sample up to max_new_tokens from `model` (logits from `model(ids)`) after a 1-D prompt, the context cropped to
    `context_length`; returns only the new token ids (1-D).

    temperature 0 is greedy decoding. top_k > 0 samples from the k most likely tokens only. top_p < 1 samples
    from the smallest set of most likely tokens whose probability mass reaches top_p. Stops right after emitting
    eos_token_id. Without a KV cache every step re-runs the (cropped) context, which is fine at course scale.
    """
    if input_ids.dim() != 1 or input_ids.numel() == 0:
        raise ValueError(f"generate expects a non-empty 1-D prompt, got shape {tuple(input_ids.shape)}.")
    tokens = input_ids.to(next(model.parameters()).device)
    new_tokens = []
    for _ in range(max_new_tokens):
        logits = model(tokens[-context_length:][None])[0, -1].float()
        if temperature == 0:
            next_token = logits.argmax().view(1)
        else:
            if 0 < top_k < logits.numel():
                logits = logits.masked_fill(logits < logits.topk(top_k).values[-1], float("-inf"))
            probs = torch.softmax(logits / temperature, dim=-1)
            if top_p < 1.0:
                sorted_probs, order = probs.sort(descending=True)
                # Drop a token when the tokens ranked above it already reach top_p; the top token stays.
                sorted_probs[sorted_probs.cumsum(0) - sorted_probs >= top_p] = 0.0
                probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
            next_token = torch.multinomial(probs, 1, generator=generator)
        new_tokens.append(next_token)
        tokens = torch.cat((tokens, next_token))
        if eos_token_id is not None and next_token.item() == eos_token_id:
            break
    if not new_tokens:
        return tokens.new_empty(0)
    return torch.cat(new_tokens)
