"""RoPE, the attention kernels and CausalSelfAttention, each against a reference written here from scratch."""

import math

import pytest
import torch
from tiny import tiny_model

from cs336_basics.errors import ConfigError
from cs336_basics.model import CausalSelfAttention, RotaryEmbedding, causal_attention, check_attention_backend

BACKENDS = ["sdpa", "math", "flash"]


def reference_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Adjacent channel pairs as complex numbers, multiplied by exp(i * pos * theta^(-2k/d)), in float64."""
    d = x.shape[-1]
    pairs = torch.view_as_complex(x.double().reshape(*x.shape[:-1], d // 2, 2).contiguous())
    freqs = theta ** (-2.0 * torch.arange(d // 2, dtype=torch.float64) / d)
    angles = positions.double()[:, None] * freqs[None, :]
    return torch.view_as_real(pairs * torch.polar(torch.ones_like(angles), angles)).reshape(x.shape)


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One query position at a time, attending to positions 0..t of its K/V group, in float64."""
    q, k, v = q.double(), k.double(), v.double()
    batch, n_heads, seq, d = q.shape
    group = n_heads // k.shape[1]
    out = torch.zeros_like(q)
    for b in range(batch):
        for h in range(n_heads):
            for t in range(seq):
                keys, values = k[b, h // group, : t + 1], v[b, h // group, : t + 1]
                weights = torch.softmax(keys @ q[b, h, t] / math.sqrt(d), dim=0)
                out[b, h, t] = weights @ values
    return out


def random_qkv(n_heads, n_kv_heads, seq=7, d=16, batch=2, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(batch, n_heads, seq, d, generator=g)
    k = torch.randn(batch, n_kv_heads, seq, d, generator=g)
    v = torch.randn(batch, n_kv_heads, seq, d, generator=g)
    return (t.to(device=device, dtype=dtype) for t in (q, k, v))


# --- RoPE --------------------------------------------------------------------------------------------


def test_rope_matches_complex_reference():
    rope = RotaryEmbedding(head_dim=16, max_seq_len=32, theta=500.0)
    x = torch.randn(2, 3, 10, 16)
    torch.testing.assert_close(rope(x), reference_rope(x, torch.arange(10), 500.0).float())
    positions = torch.tensor([5, 0, 31, 7])
    x = torch.randn(4, 16)
    torch.testing.assert_close(rope(x, positions), reference_rope(x, positions, 500.0).float())


def test_rope_inner_product_depends_only_on_offset():
    rope = RotaryEmbedding(head_dim=8, max_seq_len=64, theta=10000.0)
    q, k = torch.randn(1, 8), torch.randn(1, 8)

    def score(m, n):
        return (rope(q, torch.tensor([m])) * rope(k, torch.tensor([n]))).sum()

    for m, n, shift in [(3, 1, 10), (0, 5, 40), (7, 7, 20)]:
        torch.testing.assert_close(score(m, n), score(m + shift, n + shift), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(score(3, 1), score(1, 3))


def test_rope_keeps_dtype_and_fp32_tables():
    rope = RotaryEmbedding(head_dim=8, max_seq_len=16, theta=10000.0)
    x = torch.randn(5, 8, dtype=torch.bfloat16)
    out = rope(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, reference_rope(x, torch.arange(5), 10000.0).to(torch.bfloat16))
    # Casting the module must not round the tables; rebuilding them keeps them exact.
    before = rope.cos.clone()
    rope.to(torch.bfloat16)
    assert rope.cos.dtype == torch.float32 and torch.equal(rope.cos, before)
    assert rope.state_dict() == {}


# --- attention kernels -------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n_heads,n_kv_heads", [(4, 4), (4, 2), (6, 1)])
def test_backends_match_loop_reference(backend, n_heads, n_kv_heads):
    q, k, v = random_qkv(n_heads, n_kv_heads)
    out = causal_attention(q, k, v, backend)
    assert out.shape == q.shape and out.dtype == q.dtype
    torch.testing.assert_close(out, reference_attention(q, k, v).float(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("n_kv_heads", [4, 2])
def test_backends_agree_with_each_other(n_kv_heads):
    q, k, v = random_qkv(4, n_kv_heads, seq=33, d=32)
    outs = [causal_attention(q, k, v, b) for b in BACKENDS]
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], atol=1e-5, rtol=1e-5)


def test_unknown_backend_raises():
    q, k, v = random_qkv(2, 2)
    with pytest.raises(ConfigError):
        causal_attention(q, k, v, "xformers")
    with pytest.raises(ConfigError):
        check_attention_backend("xformers", torch.device("cpu"), torch.float32)


def test_check_backend_on_cpu():
    assert "SDPA" in check_attention_backend("sdpa", torch.device("cpu"), torch.float32)
    assert "math" in check_attention_backend("math", torch.device("cpu"), torch.float32)
    for dtype in (torch.float32, torch.bfloat16):
        with pytest.raises(ConfigError, match="CUDA"):
            check_attention_backend("flash", torch.device("cpu"), dtype)


# --- CausalSelfAttention -----------------------------------------------------------------------------


@pytest.mark.parametrize("n_kv_heads", [None, 2])
@pytest.mark.parametrize("backend", BACKENDS)
def test_self_attention_matches_manual(backend, n_kv_heads):
    config = tiny_model(n_layers=1, n_heads=4, n_kv_heads=n_kv_heads, rope_theta=1000.0, attention=backend)
    attn = CausalSelfAttention(config)
    x = torch.randn(2, 9, 32)
    out = attn(x)

    n_kv, d = config.kv_heads, 8
    xd = x.double()

    def heads(weight, n):
        return (xd @ weight.double().T).view(2, 9, n, d).transpose(1, 2)

    positions = torch.arange(9)
    q = reference_rope(heads(attn.q_proj.weight, 4), positions, 1000.0)
    k = reference_rope(heads(attn.k_proj.weight, n_kv), positions, 1000.0)
    v = heads(attn.v_proj.weight, n_kv)
    mixed = reference_attention(q, k, v).transpose(1, 2).reshape(2, 9, 32)
    expected = mixed @ attn.output_proj.weight.double().T
    torch.testing.assert_close(out, expected.float(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("n_kv_heads", [None, 2])
def test_self_attention_per_row_positions_when_batch_equals_heads(n_kv_heads):
    """Positions of shape (batch, seq) rotate each batch row by its own positions, for every head.

    With batch == n_heads they once broadcast against the head axis instead, silently rotating head h by
    row h's positions; each row run alone with 1-D positions is the unambiguous reference.
    """
    config = tiny_model(context_length=32, n_layers=1, n_heads=4, n_kv_heads=n_kv_heads, rope_theta=1000.0)
    attn = CausalSelfAttention(config)
    x = torch.randn(4, 6, 32)
    # Rows with different gaps: RoPE scores depend only on position differences, so shifted copies of one
    # row would hide a mix-up.
    g = torch.Generator().manual_seed(0)
    positions = torch.stack([torch.randperm(32, generator=g)[:6] for _ in range(4)])  # (batch=4, seq)
    out = attn(x, positions)
    for row in range(4):
        torch.testing.assert_close(out[row], attn(x[row : row + 1], positions[row])[0], atol=1e-6, rtol=1e-5)
    # One row of positions for the whole batch reads the same as 1-D positions.
    torch.testing.assert_close(attn(x, positions[:1]), attn(x, positions[0]))


def test_self_attention_refuses_positions_it_cannot_read():
    attn = CausalSelfAttention(tiny_model(context_length=32, n_layers=1, n_heads=4))
    x = torch.randn(2, 6, 32)
    for bad in (torch.arange(5), torch.zeros(3, 6, dtype=torch.long), torch.zeros(2, 1, 6, dtype=torch.long)):
        with pytest.raises(ValueError, match="positions"):
            attn(x, bad)


def test_rope_refuses_positions_that_do_not_fit():
    rope = RotaryEmbedding(head_dim=8, max_seq_len=16)
    x = torch.randn(2, 5, 8)
    torch.testing.assert_close(rope(x, torch.arange(5).expand(2, 5)), rope(x))
    for bad in (torch.arange(4), torch.zeros(3, 5, dtype=torch.long), torch.zeros(4, 2, 5, dtype=torch.long)):
        with pytest.raises(ValueError, match="positions"):
            rope(x, bad)
    with pytest.raises(ValueError, match="max_seq_len"):
        rope(torch.randn(17, 8))


def test_self_attention_is_plain_linear():
    attn = CausalSelfAttention(tiny_model(n_heads=4, n_kv_heads=2))
    for name in ("q_proj", "k_proj", "v_proj", "output_proj"):
        layer = getattr(attn, name)
        assert type(layer) is torch.nn.Linear and layer.bias is None
    assert attn.k_proj.weight.shape == (16, 32) and attn.output_proj.weight.shape == (32, 32)


# --- GPU -----------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("n_heads,n_kv_heads", [(8, 8), (8, 2)])
def test_gpu_backends_agree_in_bf16(n_heads, n_kv_heads):
    q, k, v = random_qkv(n_heads, n_kv_heads, seq=128, d=64, dtype=torch.bfloat16, device="cuda")
    expected = reference_attention(q.cpu(), k.cpu(), v.cpu()).float()
    for backend in BACKENDS:
        out = causal_attention(q, k, v, backend)
        assert out.dtype == torch.bfloat16 and out.shape == q.shape
        torch.testing.assert_close(out.float().cpu(), expected, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
def test_gpu_check_flash_backend():
    description = check_attention_backend("flash", torch.device("cuda"), torch.bfloat16)
    assert isinstance(description, str) and description
    with pytest.raises(ConfigError, match="half precision"):
        check_attention_backend("flash", torch.device("cuda"), torch.float32)
