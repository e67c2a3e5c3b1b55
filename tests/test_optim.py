"""MasterWeightAdamW (AdamW over fp32 master weights) and the cosine learning-rate schedule."""

from __future__ import annotations

import io
import math
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from cs336_basics.errors import ConfigError
from cs336_basics.optim import MasterWeightAdamW, cosine_lr, min_lr_from

# Course-layout names: two matrices (decayed) and two RMSNorm gains (not decayed).
SHAPES = {
    "token_embeddings.weight": (16, 8),
    "layers.0.attn.q_proj.weight": (8, 8),
    "layers.0.ln1.weight": (8,),
    "ln_final.weight": (8,),
}


def make_params(dtype=torch.float32, seed=0, device="cpu") -> list[tuple[str, nn.Parameter]]:
    g = torch.Generator().manual_seed(seed)
    # Values rounded to bf16 first, so an fp32 and a bf16 model can start from identical weights.
    return [
        (n, nn.Parameter(torch.randn(s, generator=g).to(torch.bfloat16).to(device=device, dtype=dtype)))
        for n, s in SHAPES.items()
    ]


def make_grads(seed: int) -> dict[str, torch.Tensor]:
    """fp32 gradients that are exactly representable in bf16 (so bf16 and fp32 models see the same)."""
    g = torch.Generator().manual_seed(1000 + seed)
    return {n: torch.randn(s, generator=g).to(torch.bfloat16).float() for n, s in SHAPES.items()}


def set_grads(named, grads: dict[str, torch.Tensor]) -> None:
    for n, p in named:
        p.grad = grads[n].to(device=p.device, dtype=p.dtype, copy=True)  # clipping works in place


def values(named) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in named}


def reference_adamw(params, grads_seq, lr, betas, eps, weight_decay):
    """The AdamW formula (Loshchilov & Hutter), written out in float64: bias-corrected moments, and weight
    decay decoupled from the gradient, applied to matrices (ndim >= 2) only."""
    b1, b2 = betas
    p = {n: v.double().clone() for n, v in params.items()}
    m = {n: torch.zeros_like(v) for n, v in p.items()}
    v = {n: torch.zeros_like(x) for n, x in p.items()}
    for t, grads in enumerate(grads_seq, start=1):
        for n in p:
            g = grads[n].double()
            wd = weight_decay if p[n].ndim >= 2 else 0.0
            p[n] -= lr * wd * p[n]
            m[n] = b1 * m[n] + (1 - b1) * g
            v[n] = b2 * v[n] + (1 - b2) * g * g
            m_hat = m[n] / (1 - b1**t)
            v_hat = v[n] / (1 - b2**t)
            p[n] -= lr * m_hat / (v_hat.sqrt() + eps)
    return p


HP = {"lr": 1e-2, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}


# ---------------------------------------------------------------- the update rule
def test_fp32_matches_reference_formula_and_torch_adamw():
    named = make_params()
    start = values(named)
    opt = MasterWeightAdamW(named, **HP)
    # torch's AdamW with the same two groups, as a second, independent reference.
    ref_named = make_params()
    ref = torch.optim.AdamW(
        [
            {"params": [p for _, p in ref_named if p.ndim >= 2], "weight_decay": HP["weight_decay"]},
            {"params": [p for _, p in ref_named if p.ndim < 2], "weight_decay": 0.0},
        ],
        lr=HP["lr"],
        betas=HP["betas"],
        eps=HP["eps"],
    )
    grads_seq = [make_grads(i) for i in range(5)]
    for grads in grads_seq:
        set_grads(named, grads)
        set_grads(ref_named, grads)
        opt.step()
        ref.step()
        opt.zero_grad()
        ref.zero_grad()

    expected = reference_adamw(start, grads_seq, **HP)
    for (n, p), (_, rp) in zip(named, ref_named, strict=True):
        torch.testing.assert_close(p.detach().double(), expected[n], rtol=0, atol=1e-6)
        torch.testing.assert_close(p.detach(), rp.detach(), rtol=0, atol=1e-6)
    # fp32 parameters are stepped in place: no copy exists.
    for (n, p), m in zip(named, opt.master_params().values(), strict=True):
        assert m is p, n


def test_weight_decay_only_on_matrices():
    named = make_params()
    start = values(named)
    lr, wd, steps = 0.1, 0.5, 3
    opt = MasterWeightAdamW(named, lr=lr, weight_decay=wd)
    decays = {g["group_name"]: g["weight_decay"] for g in opt.param_groups}
    assert decays == {"decay": wd, "no_decay": 0.0}
    zero = {n: torch.zeros(s) for n, s in SHAPES.items()}
    for _ in range(steps):
        # A zero gradient gives a zero Adam step (0 / (0 + eps)): only weight decay can move a weight.
        set_grads(named, zero)
        opt.step()
    for n, p in named:
        if p.ndim >= 2:
            torch.testing.assert_close(p.detach(), start[n] * (1 - lr * wd) ** steps)
        else:
            assert torch.equal(p.detach(), start[n]), n


def test_set_lr_and_param_groups():
    named = make_params()
    opt = MasterWeightAdamW(named, lr=1e-3)
    opt.set_lr(5e-4)
    assert [g["lr"] for g in opt.param_groups] == [5e-4, 5e-4]
    opt.param_groups[0]["lr"] = 0.0  # what an LR schedule may do directly: step() must read it
    before = values(named)
    set_grads(named, make_grads(0))
    opt.step()
    frozen_group = set(opt.param_groups[0]["param_names"])
    for n, p in named:
        assert torch.equal(p.detach(), before[n]) == (n in frozen_group), n


def test_frozen_and_gradless_params():
    named = make_params()
    named[0][1].requires_grad_(False)
    opt = MasterWeightAdamW(named, lr=1e-2)
    assert "token_embeddings.weight" not in opt.master_params()
    before = values(named)
    grads = make_grads(0)
    named[1][1].grad = grads[named[1][0]]  # only the q_proj weight gets a gradient
    opt.step()
    assert not torch.equal(named[1][1].detach(), before[named[1][0]])
    for n, p in (named[0], named[2], named[3]):
        assert torch.equal(p.detach(), before[n]), n
    assert set(opt.state_dict()["state"]) == {"layers.0.attn.q_proj.weight"}


def test_compile_prefix_is_stripped_from_names():
    named = [("_orig_mod." + n, p) for n, p in make_params()]
    opt = MasterWeightAdamW(named, lr=1e-3)
    assert list(opt.master_params()) == list(SHAPES)


def test_no_trainable_params_is_a_config_error():
    p = nn.Parameter(torch.ones(2), requires_grad=False)
    with pytest.raises(ConfigError, match="no trainable parameters"):
        MasterWeightAdamW([("w", p)], lr=1e-3)


# ---------------------------------------------------------------- why masters exist
def test_bf16_tiny_updates_survive_only_with_master_weights():
    lr, steps = 1e-5, 300  # 300 * 1e-5 = 3e-3: more than half of bf16's 2^-8 spacing just below 1.0
    grad = torch.full((4, 4), 0.5)  # constant gradient: every Adam step is ~lr in size

    def bf16_param():
        return nn.Parameter(torch.ones(4, 4, dtype=torch.bfloat16))

    w = bf16_param()
    opt = MasterWeightAdamW([("w", w)], lr=lr)
    naive_w = bf16_param()
    naive = torch.optim.AdamW([naive_w], lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    ref_w = nn.Parameter(torch.ones(4, 4))
    ref = torch.optim.AdamW([ref_w], lr=lr, betas=(0.9, 0.95), weight_decay=0.0, foreach=True)
    for _ in range(steps):
        w.grad = grad.to(torch.bfloat16)
        naive_w.grad = grad.to(torch.bfloat16)
        ref_w.grad = grad.clone()
        opt.step()
        naive.step()
        ref.step()

    master = opt.master_params()["w"]
    assert master.dtype == torch.float32 and w.dtype == torch.bfloat16
    # The fp32 master follows the fp32 run exactly, and the bf16 weight is its rounding...
    torch.testing.assert_close(master, ref_w.detach(), rtol=0, atol=1e-7)
    assert torch.equal(w.detach(), master.to(torch.bfloat16))
    assert (w.detach() < 1).all()  # ...which has moved: 1 - 3e-3 rounds to 1 - 2^-8
    # Plain AdamW on bf16 weights: each 1e-5 step rounds back to 1.0, and 300 steps are lost.
    assert torch.equal(naive_w.detach(), torch.ones(4, 4, dtype=torch.bfloat16))


# ---------------------------------------------------------------- clipping
def _global_norm(grads) -> torch.Tensor:
    return torch.sqrt(sum((g.double() ** 2).sum() for g in grads))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_returned_norm_is_the_pre_clip_global_norm(dtype):
    named = make_params(dtype)
    opt = MasterWeightAdamW(named, lr=1e-3)
    grads = make_grads(0)
    expected = _global_norm(grads.values())
    for max_norm in (None, 1e6, 0.5):
        set_grads(named, grads)
        norm = opt.step(max_grad_norm=max_norm)
        assert norm.ndim == 0 and norm.dtype == torch.float32
        torch.testing.assert_close(norm.double(), expected, rtol=1e-6, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_update_uses_clipped_grads_and_leaves_grads_alone(dtype):
    grads = make_grads(0)
    total = _global_norm(grads.values()).item()
    # factor 1: below the limit, no clipping; 0.1: the update sees the gradients scaled by a common factor.
    for max_norm, factor in ((2 * total, 1.0), (0.1 * total, 0.1)):
        named = make_params(dtype)
        opt = MasterWeightAdamW(named, lr=1e-3, betas=(0.9, 0.95))
        set_grads(named, grads)
        opt.step(max_grad_norm=max_norm)
        state = opt.state_dict()["state"]
        for n, p in named:  # first moment after one step = (1 - beta1) * clipped gradient
            torch.testing.assert_close(state[n]["exp_avg"], factor * grads[n] * (1 - 0.9), rtol=1e-5, atol=1e-8)
            assert torch.equal(p.grad.float(), grads[n]), n  # clipping happens inside the update


def test_zero_grad():
    named = make_params(torch.bfloat16)
    opt = MasterWeightAdamW(named, lr=1e-3)
    set_grads(named, make_grads(0))
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for _, p in named)
    opt.zero_grad()
    assert all(p.grad is None for _, p in named)


# ---------------------------------------------------------------- state dict
def _roundtrip(sd):
    """Through bytes and back, as a checkpoint would go: also proves the layout is weights_only-safe."""
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("serialise", [True, False])
def test_resume_is_bit_exact(dtype, serialise):
    named_a = make_params(dtype)
    opt_a = MasterWeightAdamW(named_a, **HP)
    for i in range(3):
        set_grads(named_a, make_grads(i))
        opt_a.step(max_grad_norm=1.0)
    sd = opt_a.state_dict()
    if serialise:
        sd = _roundtrip(sd)

    named_b = [(n, nn.Parameter(p.detach().clone())) for n, p in named_a]
    opt_b = MasterWeightAdamW(named_b, lr=123.0)  # hyperparameters come back from the state dict
    opt_b.load_state_dict(sd)
    assert [g["lr"] for g in opt_b.param_groups] == [HP["lr"]] * 2
    for i in range(3, 6):  # both continue; B must not share storage with A's state dict
        for named, opt in ((named_a, opt_a), (named_b, opt_b)):
            set_grads(named, make_grads(i))
            opt.step(max_grad_norm=1.0)
    for (n, pa), (_, pb) in zip(named_a, named_b, strict=True):
        assert torch.equal(pa, pb), n
    for n, m in opt_a.master_params().items():
        assert torch.equal(m, opt_b.master_params()[n]), n


def _train(named, opt, steps, first=0):
    for i in range(first, first + steps):
        set_grads(named, make_grads(i))
        opt.step()


def test_bf16_state_loads_into_fp32_model_with_full_precision():
    named_a = make_params(torch.bfloat16)
    opt_a = MasterWeightAdamW(named_a, **HP)
    _train(named_a, opt_a, 3)
    sd = _roundtrip(opt_a.state_dict())

    # The fp32 model first gets the (bf16) model weights, as load_checkpoint does, then the optimizer.
    named_b = [(n, nn.Parameter(p.detach().float())) for n, p in named_a]
    opt_b = MasterWeightAdamW(named_b, **HP)
    opt_b.load_state_dict(sd)
    masters_a = opt_a.master_params()
    for n, pb in named_b:
        assert torch.equal(pb.detach(), masters_a[n]), n  # exact fp32 values, not their bf16 rounding
    assert any(not torch.equal(masters_a[n], p.detach().float()) for n, p in named_a)

    _train(named_a, opt_a, 3, first=3)
    _train(named_b, opt_b, 3, first=3)
    for n, pb in named_b:
        assert torch.equal(pb.detach(), masters_a[n]), n


def test_fp32_state_loads_into_bf16_model_as_masters():
    named_a = make_params(torch.float32)
    opt_a = MasterWeightAdamW(named_a, **HP)
    _train(named_a, opt_a, 3)
    sd = _roundtrip(opt_a.state_dict())

    named_b = [(n, nn.Parameter(p.detach().to(torch.bfloat16))) for n, p in named_a]
    opt_b = MasterWeightAdamW(named_b, **HP)
    opt_b.load_state_dict(sd)
    masters_b = opt_b.master_params()
    for n, pa in named_a:
        assert torch.equal(masters_b[n], pa.detach()), n
        assert torch.equal(dict(named_b)[n].detach(), pa.detach().to(torch.bfloat16)), n

    _train(named_a, opt_a, 3, first=3)
    _train(named_b, opt_b, 3, first=3)
    for n, pa in named_a:
        assert torch.equal(masters_b[n], pa.detach()), n


def test_mismatched_names_are_a_config_error():
    opt_a = MasterWeightAdamW(make_params(), lr=1e-3)
    sd = opt_a.state_dict()
    renamed = [("lm_head.weight" if n == "ln_final.weight" else n, p) for n, p in make_params()]
    with pytest.raises(ConfigError) as info:
        MasterWeightAdamW(renamed, lr=1e-3).load_state_dict(sd)
    assert "lm_head.weight" in str(info.value) and "ln_final.weight" in str(info.value)


def test_mismatched_shape_or_format_is_a_config_error():
    sd = MasterWeightAdamW(make_params(), lr=1e-3).state_dict()
    named = make_params()
    named[2] = (named[2][0], nn.Parameter(torch.ones(4)))
    with pytest.raises(ConfigError, match="layers.0.ln1.weight"):
        MasterWeightAdamW(named, lr=1e-3).load_state_dict(sd)
    torch_sd = torch.optim.AdamW([p for _, p in make_params()]).state_dict()
    with pytest.raises(ConfigError, match="format"):
        MasterWeightAdamW(make_params(), lr=1e-3).load_state_dict(torch_sd)


# ---------------------------------------------------------------- the fused kernel, on CPU
# Triton's interpreter runs the CUDA kernel's code on CPU tensors, so CI checks the kernel's arithmetic too.
# It must be switched on before triton is imported, hence the subprocess. (The interpreter rounds fp32 -> bf16
# toward zero, the GPU to nearest: the bf16 weight is checked to one bf16 step here and exactly on the GPU.)
_INTERPRETED_KERNEL_CHECK = """
import torch
from cs336_basics.optim.adamw import adamw_update
from cs336_basics.kernels.adamw_triton import AdamWLaunch
from cs336_basics.optim.clipping import global_grad_norm
from cs336_basics.kernels.grad_norm_triton import GradNormLaunch
gen = torch.Generator().manual_seed(0)
# Several blocks, one short block, exactly one block, a remainder; then sizes of whole 16-element vectors only,
# which the kernels access in vectors (ALIGNED) where the addresses allow it.
for shapes, low_precision in [(s, low) for s in ([(3, 2000), (5,), (2048,), (7, 300)], [(3, 2048), (16,), (48, 80)])
                              for low in (True, False)]:
    launch = AdamWLaunch()
    for call in range(2):  # the second call reuses the address tables and the block layout
        grads = [torch.randn(s, generator=gen).to(torch.bfloat16) for s in shapes]
        masters = [torch.randn(s, generator=gen) for s in shapes]
        exp_avgs = [torch.randn(s, generator=gen) * 0.1 for s in shapes]
        exp_avg_sqs = [torch.rand(s, generator=gen) * 0.01 for s in shapes]
        steps = [torch.tensor(float(3 + i + call)) for i in range(len(shapes))]  # each tensor its own step
        expected = [[t.clone() for t in ts] for ts in (masters, exp_avgs, exp_avg_sqs)]
        params = [m.to(torch.bfloat16) for m in masters] if low_precision else None
        scalars = (torch.tensor(1e-2), torch.tensor(0.5), 0.9, 0.95, 1e-8, 0.1)
        launch(grads, masters, exp_avgs, exp_avg_sqs, steps, *scalars, params)
        for i, grad in enumerate(grads):
            adamw_update(grad, expected[0][i], expected[1][i], expected[2][i], steps[i], *scalars, None)
        for got, want in zip((masters, exp_avgs, exp_avg_sqs), expected):
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-7)
        if low_precision:
            for param, master in zip(params, masters):
                torch.testing.assert_close(param.float(), master, rtol=2**-7, atol=0)
        grads.append(torch.randn(33, generator=gen))  # a second gradient dtype: a launch of its own
        torch.testing.assert_close(GradNormLaunch()(grads), global_grad_norm(grads), rtol=1e-6, atol=0)
print("kernel ok")
"""


def test_fused_kernel_matches_the_formula_in_the_triton_interpreter():
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _INTERPRETED_KERNEL_CHECK], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and "kernel ok" in done.stdout, done.stderr[-3000:]


def test_vector_access_only_where_every_address_and_size_allows_it():
    from cs336_basics.kernels.multi_tensor import BlockLayout, DeviceInts, addresses, vector_aligned

    buffer = torch.zeros(4096)
    whole = [buffer[:1024], buffer[1024:1536]]  # 16-byte-aligned views of whole vectors (16 elements each)
    shifted = [buffer[1:1025], buffer[1025:1537]]  # the same sizes, addresses 4 bytes off a vector
    ragged = [buffer[:1024], buffer[1024:1034]]  # a size of 10 elements: a vector would run past its end

    def aligned(tensors):
        table = DeviceInts()
        addresses(table, tensors)
        return vector_aligned(BlockLayout(256)(tensors), table)

    assert buffer.data_ptr() % 16 == 0
    assert aligned(whole)
    assert not aligned(shifted)
    assert not aligned(ragged)
    table = DeviceInts()  # a table filled again follows the new addresses
    layout = BlockLayout(256)
    addresses(table, whole)
    addresses(table, shifted)
    assert not vector_aligned(layout(whole), table)


@pytest.mark.parametrize("preset", ["366m", "gpt2-small", "1.3b"])
def test_every_preset_parameter_is_a_whole_number_of_vectors(preset, monkeypatch):
    # The fused update vectorizes a launch only if every tensor in it does: one odd size would cost the whole group
    # its vector access (about a fifth of the optimizer step, benchmarks/results/2026-11-26-optimizer-vectors).
    from cs336_basics.config_layers import build_config
    from cs336_basics.kernels.multi_tensor import BlockLayout
    from cs336_basics.model import TransformerLM, layers

    # On the meta device (no memory, no init) RoPE cannot compute its tables, which are buffers, not parameters.
    meta_tables = lambda rope, device: (torch.empty(rope.max_seq_len, rope.head_dim // 2, device="meta"),) * 2
    monkeypatch.setattr(layers.RotaryEmbedding, "_tables", meta_tables)
    with torch.device("meta"):
        model = TransformerLM(build_config({"preset": preset}).model)
    assert BlockLayout(2048)(list(model.parameters())).whole_vectors


# ---------------------------------------------------------------- GPU: fused, and no host sync in step()
@pytest.mark.gpu
def test_cuda_bf16_step_is_fused_and_never_syncs():
    named = make_params(torch.bfloat16, device="cuda")
    opt = MasterWeightAdamW(named, **HP)
    assert opt.fused
    set_grads(named, make_grads(0))
    opt.step(max_grad_norm=1.0)  # first step allocates state
    set_grads(named, make_grads(1))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        norm = opt.step(max_grad_norm=1.0)
        opt.zero_grad()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert norm.is_cuda
    # The fused CUDA kernel computes the same update as the op-by-op formula on the CPU.
    cpu_named = make_params(torch.bfloat16)
    cpu_opt = MasterWeightAdamW(cpu_named, **HP)
    for i in range(2):
        set_grads(cpu_named, make_grads(i))
        cpu_opt.step(max_grad_norm=1.0)
    for n, m in opt.master_params().items():
        torch.testing.assert_close(m.cpu(), cpu_opt.master_params()[n], rtol=1e-5, atol=1e-6)
    for n, p in named:  # the BF16 weight is its master rounded to nearest, as torch rounds
        assert torch.equal(p.detach(), opt.master_params()[n].to(torch.bfloat16)), n


@pytest.mark.gpu
@pytest.mark.parametrize("misaligned", [False, True], ids=["vectors", "one-element-off"])
def test_cuda_fused_step_and_norm_match_the_formula_with_and_without_vector_access(misaligned):
    # Sizes of whole 16-element vectors (and a short last block), so only the addresses decide the path.
    shapes = {"layers.0.w.weight": (48, 2064), "layers.0.ln.weight": (2048 + 16,), "out.weight": (16, 32)}
    gen = torch.Generator().manual_seed(0)
    init = {n: torch.randn(s, generator=gen).to(torch.bfloat16) for n, s in shapes.items()}
    grads = [{n: torch.randn(s, generator=gen).to(torch.bfloat16) for n, s in shapes.items()} for _ in range(2)]

    def params(device: str) -> list[tuple[str, nn.Parameter]]:
        if device == "cpu" or not misaligned:
            return [(n, nn.Parameter(t.to(device, copy=True))) for n, t in init.items()]
        named = []  # each weight a contiguous view one element into a buffer of its own: 2 bytes off a vector
        for n, t in init.items():
            buffer = torch.empty(t.numel() + 1, dtype=t.dtype, device=device)
            view = buffer[1:].view(t.shape)
            view.copy_(t)
            named.append((n, nn.Parameter(view)))
        return named

    def run(device: str) -> tuple[MasterWeightAdamW, list[torch.Tensor]]:
        named = params(device)
        opt = MasterWeightAdamW(named, **HP)
        norms = []
        for step_grads in grads:
            for n, p in named:
                p.grad = step_grads[n].to(device, copy=True)
            norms.append(opt.step(max_grad_norm=1.0))
        return opt, norms

    cuda_opt, cuda_norms = run("cuda")
    cpu_opt, cpu_norms = run("cpu")
    assert cuda_opt.fused and not cpu_opt.fused
    assert all(p.data_ptr() % 16 == (2 if misaligned else 0) for p in cuda_opt.params)
    for got, want in zip(cuda_norms, cpu_norms, strict=True):  # fp32 sums of ~10^5 squares, added in another order
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=0)
    for n, m in cuda_opt.master_params().items():
        torch.testing.assert_close(m.cpu(), cpu_opt.master_params()[n], rtol=1e-5, atol=1e-6)
    for (n, p), master in zip(cuda_opt.named_parameters(), cuda_opt.masters, strict=True):
        assert torch.equal(p.detach(), master.to(torch.bfloat16)), n


# ---------------------------------------------------------------- schedule
def test_cosine_lr_values():
    max_lr, min_lr, warmup, total = 1.0, 0.1, 10, 110
    lr = lambda s: cosine_lr(s, max_lr, min_lr, warmup, total)
    assert lr(0) == 0.0
    assert lr(5) == pytest.approx(0.5)
    assert lr(10) == pytest.approx(max_lr)
    assert lr(60) == pytest.approx(min_lr + 0.5 * (max_lr - min_lr))  # halfway through the cosine
    assert lr(35) == pytest.approx(min_lr + 0.5 * (1 + math.cos(math.pi / 4)) * (max_lr - min_lr))
    assert lr(110) == pytest.approx(min_lr)
    assert lr(111) == lr(10_000) == min_lr
    values = [lr(s) for s in range(warmup, total + 1)]
    assert all(a >= b for a, b in zip(values, values[1:], strict=False))  # monotone decay


def test_cosine_lr_degenerate_phases():
    assert cosine_lr(0, 1.0, 0.1, 0, 100) == pytest.approx(1.0)  # no warmup: starts at max
    assert cosine_lr(50, 1.0, 0.1, 0, 100) == pytest.approx(0.55)
    # No decay phase (total == warmup): ramp, max at the end of warmup, then the floor.
    assert cosine_lr(5, 1.0, 0.1, 10, 10) == pytest.approx(0.5)
    assert cosine_lr(10, 1.0, 0.1, 10, 10) == pytest.approx(1.0)
    assert cosine_lr(11, 1.0, 0.1, 10, 10) == 0.1
    assert cosine_lr(0, 1.0, 0.1, 0, 0) == pytest.approx(1.0)


@pytest.mark.parametrize(("warmup", "total"), [(10, 110), (0, 5), (10, 10), (40, 30), (3, 0)])
def test_min_lr_from_is_the_first_step_of_the_floor(warmup, total):
    lrs = [cosine_lr(s, 1.0, 0.1, warmup, total) for s in range(200)]
    first = min_lr_from(warmup, total)
    assert lrs[first] == pytest.approx(0.1) and all(lr == pytest.approx(0.1) for lr in lrs[first:])
    assert lrs[first - 1] > 0.1 + 1e-9
