"""Layers and the full LM against references written here with plain tensor ops."""

import dataclasses
import io
import math

import pytest
import torch
from tiny import tiny_model

from cs336_basics.config import ModelConfig
from cs336_basics.model import RMSNorm, SwiGLU, TransformerLM, init_weights

# Grouped-query heads and a vocabulary and FFN width that are not multiples of 16, on top of the shared tiny model.
TINY = tiny_model(vocab_size=50, n_heads=4, n_kv_heads=2, intermediate_size=48, rope_theta=1000.0)


def tiny(**overrides) -> ModelConfig:
    return dataclasses.replace(TINY, **overrides)


def make_model(seed=0, **overrides) -> TransformerLM:
    torch.manual_seed(seed)
    return TransformerLM(tiny(**overrides))


def course_layout(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The CS336 state dict: every key and its (out, in) shape, written out from the config alone."""
    d, hd = c.dim, c.dim // c.n_heads
    kv = (c.n_kv_heads or c.n_heads) * hd
    shapes = {"token_embeddings.weight": (c.vocab_size, d)}
    for i in range(c.n_layers):
        shapes |= {
            f"layers.{i}.attn.q_proj.weight": (d, d),
            f"layers.{i}.attn.k_proj.weight": (kv, d),
            f"layers.{i}.attn.v_proj.weight": (kv, d),
            f"layers.{i}.attn.output_proj.weight": (d, d),
            f"layers.{i}.ln1.weight": (d,),
            f"layers.{i}.ln2.weight": (d,),
            f"layers.{i}.ffn.w1.weight": (c.intermediate_size, d),
            f"layers.{i}.ffn.w2.weight": (d, c.intermediate_size),
            f"layers.{i}.ffn.w3.weight": (c.intermediate_size, d),
        }
    return shapes | {"ln_final.weight": (d,), "lm_head.weight": (c.vocab_size, d)}


def reference_forward(sd: dict[str, torch.Tensor], c: ModelConfig, ids: torch.Tensor) -> torch.Tensor:
    """The whole LM in float64 from a course-layout state dict, with no code from the package."""
    sd = {k: v.double() for k, v in sd.items()}
    n_h, n_kv, hd = c.n_heads, c.n_kv_heads or c.n_heads, c.dim // c.n_heads
    batch, seq = ids.shape

    def rms(x, w):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + c.norm_eps) * w

    def rope(x):  # x: (batch, heads, seq, hd); adjacent pairs as complex numbers
        pairs = torch.view_as_complex(x.reshape(*x.shape[:-1], hd // 2, 2).contiguous())
        angles = torch.arange(seq)[:, None] * c.rope_theta ** (-2.0 * torch.arange(hd // 2) / hd)
        return torch.view_as_real(pairs * torch.exp(1j * angles.double())).reshape(x.shape)

    future = torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1)
    x = sd["token_embeddings.weight"][ids]
    for i in range(c.n_layers):
        p = {k.removeprefix(f"layers.{i}."): v for k, v in sd.items() if k.startswith(f"layers.{i}.")}
        h = rms(x, p["ln1.weight"])
        q = rope((h @ p["attn.q_proj.weight"].T).view(batch, seq, n_h, hd).transpose(1, 2))
        k = rope((h @ p["attn.k_proj.weight"].T).view(batch, seq, n_kv, hd).transpose(1, 2))
        v = (h @ p["attn.v_proj.weight"].T).view(batch, seq, n_kv, hd).transpose(1, 2)
        k, v = (t.repeat_interleave(n_h // n_kv, dim=1) for t in (k, v))
        scores = (q @ k.transpose(-1, -2) / math.sqrt(hd)).masked_fill(future, -math.inf)
        att = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, seq, c.dim)
        x = x + att @ p["attn.output_proj.weight"].T
        h = rms(x, p["ln2.weight"])
        gate = h @ p["ffn.w1.weight"].T
        x = x + (gate * torch.sigmoid(gate) * (h @ p["ffn.w3.weight"].T)) @ p["ffn.w2.weight"].T
    return rms(x, sd["ln_final.weight"]) @ sd["lm_head.weight"].T


# --- layers --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_matches_formula(dtype):
    norm = RMSNorm(24, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(24))
    x = (torch.randn(3, 5, 24) * 4).to(dtype)
    out = norm(x)
    assert out.dtype == dtype
    xf = x.float()
    expected = xf / torch.sqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight
    torch.testing.assert_close(out, expected.to(dtype))
    assert [n for n, _ in norm.named_parameters()] == ["weight"]


def test_swiglu_matches_formula():
    ffn = SwiGLU(16, 40)
    x = torch.randn(2, 3, 16)
    a, b = x @ ffn.w1.weight.T, x @ ffn.w3.weight.T
    expected = (a * torch.sigmoid(a) * b) @ ffn.w2.weight.T
    torch.testing.assert_close(ffn(x), expected)
    assert all(type(m) is torch.nn.Linear and m.bias is None for m in (ffn.w1, ffn.w2, ffn.w3))


def test_init_statistics():
    torch.manual_seed(0)
    model = torch.nn.ModuleDict(
        {"lin": torch.nn.Linear(300, 500, bias=False), "emb": torch.nn.Embedding(400, 300), "norm": RMSNorm(7)}
    )
    with torch.no_grad():
        model["norm"].weight.zero_()
    init_weights(model)
    std = math.sqrt(2 / 800)
    w = model["lin"].weight
    assert abs(w.std().item() - std) < 0.05 * std and w.abs().max() <= 3 * std
    e = model["emb"].weight
    assert abs(e.std().item() - 1) < 0.05 and e.abs().max() <= 3
    assert torch.equal(model["norm"].weight, torch.ones(7))


# --- the LM --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("overrides", [{}, {"n_kv_heads": None}, {"tie_embeddings": True}])
def test_state_dict_is_course_layout(overrides):
    model = make_model(**overrides)
    expected = course_layout(model.config)
    sd = model.state_dict()
    # Key order is irrelevant to load_state_dict; names and shapes are what must match the course.
    assert {k: tuple(v.shape) for k, v in sd.items()} == expected
    assert not any("cos" in k or "sin" in k or "rope" in k for k in sd)


def test_matches_reference_on_independent_state_dict():
    model = make_model()
    ids = torch.randint(0, 50, (2, 11))
    before = model(ids)
    g = torch.Generator().manual_seed(123)
    sd = {k: torch.randn(shape, generator=g) * 0.3 for k, shape in course_layout(TINY).items()}
    model.load_state_dict(sd)
    after = model(ids)
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, reference_forward(sd, TINY, ids).float(), atol=1e-4, rtol=1e-4)


def test_save_load_round_trip():
    model, other = make_model(seed=0), make_model(seed=1)
    ids = torch.randint(0, 50, (2, 16))
    assert not torch.allclose(model(ids), other(ids))
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    other.load_state_dict(torch.load(buffer, weights_only=True))
    assert torch.equal(model(ids), other(ids))


def test_tied_embeddings():
    model = make_model(tie_embeddings=True)
    assert model.lm_head.weight is model.token_embeddings.weight
    # The shared matrix gets the output layer's small init, not N(0, 1).
    assert model.lm_head.weight.std() < 0.5
    ids = torch.randint(0, 50, (1, 8))
    model(ids, ids).backward()
    assert model.token_embeddings.weight.grad is not None


def test_num_parameters_by_hand():
    # dim 32, 4 heads of 8, 2 K/V heads, SwiGLU hidden 48, vocab 50, 2 layers.
    attn = 32 * 32 + 2 * (32 * 16) + 32 * 32
    layer = attn + 3 * 32 * 48 + 2 * 32
    body = 2 * layer + 32
    emb = 50 * 32
    assert make_model().num_parameters() == body + 2 * emb
    assert make_model().num_parameters(exclude_embeddings=True) == body + emb
    tied = make_model(tie_embeddings=True)
    assert tied.num_parameters() == tied.num_parameters(exclude_embeddings=True) == body + emb


def test_causal_masking():
    model = make_model()
    ids = torch.randint(0, 50, (1, 12))
    logits = model(ids)
    for t in (0, 5, 11):
        changed = ids.clone()
        changed[0, t] = (changed[0, t] + 1) % 50
        new = model(changed)
        torch.testing.assert_close(new[:, :t], logits[:, :t], atol=0, rtol=0)
        assert not torch.allclose(new[:, t], logits[:, t])


def test_loss_matches_manual_cross_entropy():
    model = make_model()
    ids, targets = torch.randint(0, 50, (3, 10)), torch.randint(0, 50, (3, 10))
    logits = model(ids).double()
    log_probs = logits - logits.logsumexp(-1, keepdim=True)
    expected = -log_probs.gather(-1, targets[..., None]).mean()
    loss = model(ids, targets)
    assert loss.shape == () and loss.dtype == torch.float32
    torch.testing.assert_close(loss.double(), expected, atol=1e-5, rtol=1e-5)


def test_too_long_input_raises():
    with pytest.raises(ValueError, match="context_length"):
        make_model()(torch.zeros(1, 17, dtype=torch.long))


def test_gradient_checkpointing_matches():
    plain, ckpt = make_model(), make_model(gradient_checkpointing=True)
    ckpt.load_state_dict(plain.state_dict())
    ids, targets = torch.randint(0, 50, (2, 16)), torch.randint(0, 50, (2, 16))
    losses = []
    for model in (plain, ckpt):
        loss = model(ids, targets)
        loss.backward()
        losses.append(loss)
    torch.testing.assert_close(losses[0], losses[1], atol=0, rtol=0)
    for (name, a), b in zip(plain.named_parameters(), ckpt.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, msg=name)


# --- generation ----------------------------------------------------------------------------------------


def greedy_by_hand(model, prompt, n):
    tokens = prompt.tolist()
    for _ in range(n):
        context = torch.tensor(tokens[-model.config.context_length :])[None]
        tokens.append(int(model(context)[0, -1].argmax()))
    return tokens[len(prompt) :]


def test_generate_greedy():
    model = make_model()
    prompt = torch.tensor([3, 1, 4, 1, 5])
    out = model.generate(prompt, 8, temperature=0)
    assert out.shape == (8,) and out.dtype == torch.long
    assert out.tolist() == greedy_by_hand(model, prompt, 8)
    assert torch.equal(out, model.generate(prompt, 8, temperature=0))
    # A nucleus so small that only the top token survives is greedy too.
    assert torch.equal(out, model.generate(prompt, 8, top_p=1e-6))
    assert model.generate(prompt, 0).numel() == 0


def test_generate_stops_at_eos():
    model = make_model()
    prompt = torch.tensor([7, 8, 9])
    greedy = model.generate(prompt, 10, temperature=0).tolist()
    eos = greedy[3]
    out = model.generate(prompt, 10, temperature=0, eos_token_id=eos).tolist()
    assert out == greedy[: greedy.index(eos) + 1]


def test_generate_crops_long_prompts():
    model = make_model()
    prompt = torch.randint(0, 50, (40,))  # longer than context_length (16)
    out = model.generate(prompt, 6, temperature=0)
    assert out.tolist() == greedy_by_hand(model, prompt, 6)
    assert torch.equal(out, model.generate(prompt[-16:], 6, temperature=0))


def test_generate_sampling_is_seeded():
    model = make_model()
    prompt = torch.tensor([1, 2])

    def sample(seed):
        g = torch.Generator().manual_seed(seed)
        return model.generate(prompt, 12, temperature=1.5, top_p=0.9, generator=g)

    assert torch.equal(sample(0), sample(0))
    assert sample(0).shape == (12,) and int(sample(0).max()) < 50


# --- torch.compile -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides", [{}, {"attention": "math"}, {"attention": "flash"}, {"gradient_checkpointing": True}]
)
def test_no_graph_breaks(overrides):
    model = make_model(**overrides)
    ids = torch.randint(0, 50, (2, 16))
    try:
        assert torch._dynamo.explain(model)(ids).graph_break_count == 0
        assert torch._dynamo.explain(model)(ids, ids).graph_break_count == 0
    finally:
        torch._dynamo.reset()


# --- GPU -----------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_bf16_backends_agree():
    torch.manual_seed(0)
    config = tiny(dim=128, n_heads=2, n_kv_heads=1, intermediate_size=256, context_length=64)
    ids = torch.randint(0, 50, (2, 64), device="cuda")
    weights = TransformerLM(config).state_dict()
    outputs = {}
    for backend in ("sdpa", "math", "flash"):
        model = TransformerLM(dataclasses.replace(config, attention=backend))
        model.load_state_dict(weights)
        model.to("cuda", torch.bfloat16)
        assert model.layers[0].attn.rope.cos.dtype == torch.float32
        outputs[backend] = model(ids).float()
        assert torch.isfinite(model(ids, ids))
    torch.testing.assert_close(outputs["sdpa"], outputs["math"], atol=5e-2, rtol=5e-2)
    torch.testing.assert_close(outputs["flash"], outputs["math"], atol=5e-2, rtol=5e-2)


@pytest.mark.gpu
def test_gpu_compiled_training_step():
    torch.manual_seed(0)
    model = TransformerLM(tiny(dim=128, n_heads=2, intermediate_size=256, gradient_checkpointing=True))
    model.to("cuda")
    ids = torch.randint(0, 50, (2, 16), device="cuda")
    compiled = torch.compile(model, fullgraph=True)
    try:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = compiled(ids, ids)
            eager = model(ids, ids)
        loss.backward()
        torch.testing.assert_close(loss, eager, atol=2e-2, rtol=2e-2)
        assert all(p.grad is not None for p in model.parameters())
    finally:
        torch._dynamo.reset()
