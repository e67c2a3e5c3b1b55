"""The course's modules: constructors, state-dict keys, numerics against float64 references written here,
and TorchAO FP8 conversion of models built from them."""

import math

import pytest
import torch
from torch import nn

from cs336_basics import (
    Embedding,
    Linear,
    MultiHeadSelfAttention,
    RMSNorm,
    RotaryPositionalEmbedding,
    SwiGLU,
    TransformerBlock,
    TransformerLM,
)
from cs336_basics.config import FP8Config, ModelConfig
from cs336_basics.model import transformer
from cs336_basics.precision import convert_model_to_fp8, count_float8_linears

# --- references (float64, from course-layout weights) ---------------------------------------------------


def ref_rms(x, w, eps=1e-5):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def ref_rope(x, positions, theta):
    """x (..., seq, d) with positions broadcastable to x.shape[:-1]: pairs (2i, 2i+1) as complex numbers."""
    d = x.shape[-1]
    pairs = torch.view_as_complex(x.double().reshape(*x.shape[:-1], d // 2, 2).contiguous())
    angles = positions.double()[..., None] * theta ** (-2.0 * torch.arange(d // 2, dtype=torch.float64) / d)
    return torch.view_as_real(pairs * torch.polar(torch.ones_like(angles), angles)).reshape(x.shape)


def ref_mhsa(x, w, n_heads, positions=None, theta=None):
    """x (batch, seq, d); w: q_proj, k_proj, v_proj, output_proj weights; causal."""
    batch, seq, d = x.shape
    hd = d // n_heads

    def heads(weight):
        return (x.double() @ weight.double().T).view(batch, seq, n_heads, hd).transpose(1, 2)

    q, k, v = heads(w["q_proj.weight"]), heads(w["k_proj.weight"]), heads(w["v_proj.weight"])
    if theta is not None:
        pos = positions[:, None, :]  # (batch, 1, seq): the same positions for every head
        q, k = ref_rope(q, pos, theta), ref_rope(k, pos, theta)
    scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
    scores = scores.masked_fill(torch.ones(seq, seq, dtype=torch.bool).triu(1), -math.inf)
    out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, seq, d)
    return out @ w["output_proj.weight"].double().T


def ref_block(x, w, n_heads, theta):
    sub = {k.removeprefix("attn."): v for k, v in w.items() if k.startswith("attn.")}
    positions = torch.arange(x.shape[1]).expand(x.shape[0], -1)
    x = x + ref_mhsa(ref_rms(x, w["ln1.weight"].double()), sub, n_heads, positions, theta)
    h = ref_rms(x, w["ln2.weight"].double())
    gate = h @ w["ffn.w1.weight"].double().T
    return x + (gate * torch.sigmoid(gate) * (h @ w["ffn.w3.weight"].double().T)) @ w["ffn.w2.weight"].double().T


def random_weights(module: nn.Module, seed: int = 0, scale: float = 0.3) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(v.shape, generator=g) * scale for k, v in module.state_dict().items()}


# --- small modules ---------------------------------------------------------------------------------------


def test_linear():
    torch.manual_seed(0)
    layer = Linear(300, 500)
    assert isinstance(layer, nn.Linear) and layer.bias is None
    assert {k: tuple(v.shape) for k, v in layer.state_dict().items()} == {"weight": (500, 300)}
    std = math.sqrt(2 / 800)
    assert abs(layer.weight.std().item() - std) < 0.05 * std and layer.weight.abs().max() <= 3 * std
    x = torch.randn(2, 3, 300)
    torch.testing.assert_close(layer(x), (x.double() @ layer.weight.double().T).float(), atol=1e-5, rtol=1e-5)
    assert Linear(4, 6, dtype=torch.float64, device="cpu").weight.dtype == torch.float64


def test_embedding():
    torch.manual_seed(0)
    emb = Embedding(1000, 64)
    assert {k: tuple(v.shape) for k, v in emb.state_dict().items()} == {"weight": (1000, 64)}
    assert abs(emb.weight.std().item() - 1) < 0.05 and emb.weight.abs().max() <= 3
    ids = torch.tensor([[3, 999, 0], [3, 3, 7]])
    assert torch.equal(emb(ids), emb.weight[ids])


def test_rmsnorm():
    norm = RMSNorm(16, eps=0.5)
    norm.load_state_dict({"weight": torch.randn(16)})
    x = torch.randn(2, 3, 16) * 3
    torch.testing.assert_close(norm(x), ref_rms(x.double(), norm.weight.double(), eps=0.5).float())
    assert RMSNorm(16).eps == 1e-5 and list(RMSNorm(16).state_dict()) == ["weight"]


def test_swiglu():
    ffn = SwiGLU(d_model=16, d_ff=40)
    weights = random_weights(ffn)
    assert {k: tuple(v.shape) for k, v in weights.items()} == {
        "w1.weight": (40, 16), "w2.weight": (16, 40), "w3.weight": (40, 16),
    }  # fmt: skip
    ffn.load_state_dict(weights)
    x = torch.randn(2, 5, 16).double()
    gate = x @ weights["w1.weight"].double().T
    expected = (gate * torch.sigmoid(gate) * (x @ weights["w3.weight"].double().T)) @ weights["w2.weight"].double().T
    torch.testing.assert_close(ffn(x.float()), expected.float(), atol=1e-5, rtol=1e-5)


def test_rope_with_positions_of_any_leading_shape():
    rope = RotaryPositionalEmbedding(theta=500.0, d_k=8, max_seq_len=40)
    assert rope.state_dict() == {}
    x = torch.randn(2, 3, 5, 8)
    g = torch.Generator().manual_seed(0)
    for positions in (torch.arange(5), torch.randint(0, 40, (2, 1, 5), generator=g), torch.randint(0, 40, (2, 3, 5))):
        expected = ref_rope(x, positions, 500.0)
        torch.testing.assert_close(rope(x, positions), expected.float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rope(x), rope(x, torch.arange(5)))
    with pytest.raises(ValueError, match="positions"):
        rope(x, torch.zeros(4, 5, dtype=torch.long))  # would broadcast against the 3-axis, not the batch


# --- attention --------------------------------------------------------------------------------------------


def test_attention_without_rope():
    attn = MultiHeadSelfAttention(d_model=32, num_heads=4)
    assert attn.rope is None
    weights = random_weights(attn)
    assert {k: tuple(v.shape) for k, v in weights.items()} == {
        f"{n}.weight": (32, 32) for n in ("q_proj", "k_proj", "v_proj", "output_proj")
    }
    attn.load_state_dict(weights)
    x = torch.randn(3, 9, 32)
    torch.testing.assert_close(attn(x), ref_mhsa(x, weights, 4).float(), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="no RoPE"):
        attn(x, torch.arange(9))
    with pytest.raises(ValueError, match="both"):
        MultiHeadSelfAttention(32, 4, max_seq_len=16)


def test_attention_with_rope_and_token_positions():
    # batch == num_heads: the shape combination that once rotated head h by row h's positions.
    attn = MultiHeadSelfAttention(d_model=32, num_heads=4, max_seq_len=64, theta=1000.0)
    weights = random_weights(attn, seed=1)
    attn.load_state_dict(weights)
    x = torch.randn(4, 7, 32)
    g = torch.Generator().manual_seed(2)
    positions = torch.stack([torch.randperm(64, generator=g)[:7] for _ in range(4)])
    expected = ref_mhsa(x, weights, 4, positions, 1000.0).float()
    torch.testing.assert_close(attn(x, positions), expected, atol=1e-5, rtol=1e-5)
    # Default positions are 0..seq-1, for every row; (1, seq) and (seq,) mean the same.
    default = ref_mhsa(x, weights, 4, torch.arange(7).expand(4, 7), 1000.0).float()
    for given in (None, torch.arange(7), torch.arange(7)[None]):
        torch.testing.assert_close(attn(x, given), default, atol=1e-5, rtol=1e-5)
    # Extra leading dims: (2, 2, seq, d) with positions (2, 2, seq) is the (4, seq, d) case reshaped.
    torch.testing.assert_close(attn(x.view(2, 2, 7, 32), positions.view(2, 2, 7)), expected.view(2, 2, 7, 32),
                               atol=1e-5, rtol=1e-5)  # fmt: skip
    with pytest.raises(ValueError, match="token_positions"):
        attn(x, torch.zeros(3, 7, dtype=torch.long))


# --- block and LM -----------------------------------------------------------------------------------------


def test_transformer_block():
    block = TransformerBlock(d_model=32, num_heads=4, d_ff=48, max_seq_len=16, theta=1000.0)
    weights = random_weights(block, seed=3)
    assert set(weights) == {
        "ln1.weight", "ln2.weight", "ffn.w1.weight", "ffn.w2.weight", "ffn.w3.weight",
        "attn.q_proj.weight", "attn.k_proj.weight", "attn.v_proj.weight", "attn.output_proj.weight",
    }  # fmt: skip
    block.load_state_dict(weights)
    x = torch.randn(2, 11, 32)
    torch.testing.assert_close(block(x), ref_block(x.double(), weights, 4, 1000.0).float(), atol=1e-5, rtol=1e-5)


def test_transformer_lm():
    lm = TransformerLM(
        vocab_size=50, context_length=16, d_model=32, num_layers=2, num_heads=4, d_ff=48, rope_theta=1000.0
    )
    assert isinstance(lm, transformer.TransformerLM)
    c = lm.config
    assert (c.vocab_size, c.context_length, c.dim, c.n_layers, c.n_heads, c.intermediate_size, c.rope_theta) == (
        50, 16, 32, 2, 4, 48, 1000.0,
    )  # fmt: skip
    weights = random_weights(lm, seed=4)
    assert {k for k in weights if not k.startswith("layers.")} == {
        "token_embeddings.weight", "lm_head.weight", "ln_final.weight",
    }  # fmt: skip
    assert {k.split(".", 2)[1] for k in weights if k.startswith("layers.")} == {"0", "1"}
    lm.load_state_dict(weights)
    ids = torch.randint(0, 50, (3, 16))
    x = weights["token_embeddings.weight"].double()[ids]
    for i in range(2):
        x = ref_block(x, {k.removeprefix(f"layers.{i}."): v for k, v in weights.items()
                          if k.startswith(f"layers.{i}.")}, 4, 1000.0)  # fmt: skip
    expected = ref_rms(x, weights["ln_final.weight"].double()) @ weights["lm_head.weight"].double().T
    torch.testing.assert_close(lm(ids), expected.float(), atol=1e-5, rtol=1e-5)
    assert TransformerLM(50, 16, 32, 1, 4, 48, 1e4, dtype=torch.float64).lm_head.weight.dtype == torch.float64


# --- FP8 conversion ------------------------------------------------------------------------------------------

EMULATE = FP8Config(use_fp8=True, fp8_emulate=True, fp8_lm_head=True)


def test_course_lm_converts_to_fp8_like_ours():
    args = dict(vocab_size=128, context_length=32, d_model=64, num_layers=2, num_heads=4, d_ff=128, rope_theta=1e4)
    course = TransformerLM(**args, dtype=torch.bfloat16)
    ours = transformer.TransformerLM(
        ModelConfig(vocab_size=128, context_length=32, dim=64, n_layers=2, n_heads=4, intermediate_size=128)
    ).to(torch.bfloat16)
    course_report, our_report = convert_model_to_fp8(course, EMULATE), convert_model_to_fp8(ours, EMULATE)
    assert course_report.converted == our_report.converted
    assert count_float8_linears(course) == count_float8_linears(ours) == 2 * 7 + 1


def test_course_linears_convert_to_fp8():
    torch.manual_seed(0)
    model = nn.Sequential(Linear(64, 128), nn.ReLU(), Linear(128, 32)).to(torch.bfloat16)
    x = torch.randn(16, 64, dtype=torch.bfloat16)
    before = model(x).float()
    report = convert_model_to_fp8(model, FP8Config(use_fp8=True, fp8_emulate=True))
    assert report.converted == ["0", "2"] and count_float8_linears(model) == 2
    after = model(x).float()
    # FP8 rounding changes the output a little, not a lot: signal-to-noise above 20 dB.
    snr = 10 * torch.log10(before.pow(2).sum() / (before - after).pow(2).sum())
    assert 20 < snr.item() < 80
