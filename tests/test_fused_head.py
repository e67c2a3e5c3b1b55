"""The FP8 lm_head with its loss fused (--fp8_lm_head on the fused path): the loss and the logits' gradient against
F.cross_entropy's, the bound that scales the gradient's cast, and the head against a BF16 head (values and
gradients, ignored targets, a scaled upstream gradient as in gradient accumulation). CPU runs torch's FP8 casts and
_scaled_mm; the compiled head is checked on the GPU (marked)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from numerics import RecordScaledMM, sqnr_db
from tiny import tiny_model
from torch import nn

from cs336_basics.config import FinetuneConfig, FP8Config
from cs336_basics.lora import apply_lora
from cs336_basics.model import TransformerLM
from cs336_basics.precision import FusedFP8
from cs336_basics.precision.fused import head as head_module
from cs336_basics.precision.fused.head import Fp8LMHead, cross_entropy_from_logits, logits_grad
from cs336_basics.precision.fused.scaling import E4M3, E5M2, SiteScaling

DTYPES = (E4M3, E4M3, E5M2)


def logits_and_targets(rows: int = 48, vocab: int = 96, spread: float = 4.0, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(rows, vocab, generator=gen) * spread).to(torch.bfloat16)
    targets = torch.randint(0, vocab, (rows,), generator=gen)
    targets[::5] = -100  # ignored rows, as padding would be
    return logits, targets


def test_loss_and_gradient_are_cross_entropys():
    logits, targets = logits_and_targets()
    leaf = logits.float().requires_grad_()
    expected = F.cross_entropy(leaf, targets)
    expected.backward(torch.tensor(0.25))  # an upstream gradient other than 1, as gradient accumulation gives
    loss, lse, valid, count = cross_entropy_from_logits(logits, targets)
    torch.testing.assert_close(loss, expected.detach())
    assert count.item() == int((targets != -100).sum())
    grad = logits_grad(logits, lse, targets, valid, torch.tensor(0.25) / count)
    torch.testing.assert_close(grad, leaf.grad)
    assert not grad[targets == -100].any()


@pytest.mark.parametrize("spread", [0.01, 4.0, 200.0])
def test_the_scale_bound_holds_and_is_nearly_tight(spread):
    """|d loss / d logits| <= dloss / n_valid, the amax the cast uses; and a language model's batch comes close to it
    (some token's |softmax - onehot| is near 1), so the cast loses no resolution against dynamic scaling."""
    logits, targets = logits_and_targets(spread=spread)
    _, lse, valid, count = cross_entropy_from_logits(logits, targets)
    bound = torch.tensor(0.5) / count
    grad = logits_grad(logits, lse, targets, valid, bound)
    assert grad.abs().max() <= bound
    assert grad.abs().max() >= 0.5 * bound


def head_pair(vocab: int = 96, dim: int = 64) -> tuple[nn.Linear, Fp8LMHead]:
    torch.manual_seed(0)
    bf16 = nn.Linear(dim, vocab, bias=False).to(torch.bfloat16)
    nn.init.normal_(bf16.weight, std=0.1)
    copy = nn.Linear(dim, vocab, bias=False).to(torch.bfloat16)
    copy.load_state_dict(bf16.state_dict())
    return bf16, Fp8LMHead(copy, SiteScaling(DTYPES))


@pytest.mark.parametrize("upstream", [0.5, -0.5])
def test_fused_head_matches_a_bf16_head_and_cross_entropy(upstream):
    """Also with a negative upstream gradient: its sign reaches the GEMMs through the gradient's scale."""
    bf16, fp8 = head_pair()
    x = torch.randn(4, 12, 64, dtype=torch.bfloat16)
    targets = torch.randint(0, 96, (4, 12))
    targets[0, :3] = -100
    xs = (x.clone().requires_grad_(), x.clone().requires_grad_())
    losses = (F.cross_entropy(bf16(xs[0]).float().flatten(0, 1), targets.flatten()),
              fp8.linear_cross_entropy(xs[1], targets))  # fmt: skip
    for loss in losses:
        (loss * upstream).backward()
    assert losses[1].item() == pytest.approx(losses[0].item(), rel=0.01)
    # The same value as the head's logits through the model's cross_entropy: only the gradient's path differs.
    same = F.cross_entropy(fp8(x).float().flatten(0, 1), targets.flatten())
    torch.testing.assert_close(losses[1], same)
    assert xs[1].grad.shape == x.shape and sqnr_db(xs[0].grad, xs[1].grad) > 18
    assert sqnr_db(bf16.weight.grad, fp8.weight.grad) > 18


def test_the_forward_saves_the_fp8_gradient_not_the_logits_and_evaluation_writes_none():
    """The step's peak is in the head's backward: saving the BF16 logits there put FP8's peak above BF16's
    (benchmarks/results/2026-11-24-head-memory-h200). Only the FP8 logits' gradient is saved (half the bytes)."""
    _, fp8 = head_pair()
    x = torch.randn(4, 12, 64, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, 96, (4, 12))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        fp8.linear_cross_entropy(x, targets)
    vocab_sized = [t.dtype for t in saved if t.shape == (48, 96)]
    assert vocab_sized == [DTYPES[2]]
    with torch.no_grad():
        loss = fp8.linear_cross_entropy(x, targets)
    torch.testing.assert_close(loss, F.cross_entropy(fp8(x).float().flatten(0, 1), targets.flatten()))


def test_conversion_gives_the_model_a_fused_loss_head_used_only_with_targets():
    torch.manual_seed(0)
    model = TransformerLM(tiny_model()).to(torch.bfloat16)
    report = FusedFP8(FP8Config(use_fp8=True, fp8_emulate=True, fp8_path="fused", fp8_lm_head=True)).convert(model)
    assert isinstance(model.lm_head, Fp8LMHead) and report.fused_loss_head
    assert "(lm_head's loss fused)" in report.summary_line()
    ids = torch.randint(0, model.config.vocab_size, (2, 16))
    calls = []
    fused = model.lm_head.linear_cross_entropy
    model.lm_head.linear_cross_entropy = lambda *a: calls.append(1) or fused(*a)
    loss = model(ids, targets=ids)
    logits = model(ids)
    assert calls == [1] and logits.shape == (2, 16, model.config.vocab_size)
    torch.testing.assert_close(loss, F.cross_entropy(logits.float().flatten(0, 1), ids.flatten()))


@pytest.mark.gpu
@pytest.mark.parametrize("upstream", [1.0, -0.5])
def test_gpu_compiled_fused_head_matches_a_bf16_head(upstream):
    bf16, fp8 = head_pair(vocab=4096, dim=256)
    bf16, fp8 = bf16.cuda(), fp8.cuda()
    fp8.scaling = fp8.scaling.cuda()
    x = torch.randn(8, 256, 256, device="cuda", dtype=torch.bfloat16)
    targets = torch.randint(0, 4096, (8, 256), device="cuda")
    compiled = torch.compile(fp8.linear_cross_entropy, fullgraph=True)
    xs = (x.clone().requires_grad_(), x.clone().requires_grad_())
    losses = (F.cross_entropy(bf16(xs[0]).float().flatten(0, 1), targets.flatten()), compiled(xs[1], targets))
    for loss in losses:
        (loss * upstream).backward()
    assert losses[1].item() == pytest.approx(losses[0].item(), rel=0.01)
    assert sqnr_db(xs[0].grad, xs[1].grad) > 18 and sqnr_db(bf16.weight.grad, fp8.weight.grad) > 18


@pytest.mark.parametrize("lora_targets", [None, "attn", "attn,lm_head"])
def test_the_heads_backward_gemms_never_accumulate_fast(lora_targets):
    # --fp8_fast_accum_backward reaches every backward FP8 GEMM but the head's, whose results it ruined on the GPU
    # (fast_accum_backward in precision/fused/units.py says why and where it was measured).
    torch.manual_seed(0)
    vocab = 112  # no other dimension of the tiny model (joint dx GEMMs: 96, 128): the head's backward GEMMs have it
    model = TransformerLM(tiny_model(vocab_size=vocab)).to(torch.bfloat16)
    fp8 = FP8Config(use_fp8=True, fp8_emulate=True, fp8_path="fused", fp8_lm_head=True, fp8_fast_accum_backward=True)
    if lora_targets:  # a frozen base; with adapters on the head, it is not the loss-fused head but a FrozenLinear
        report = apply_lora(model, FinetuneConfig(init_from="x", lora_rank=4, lora_targets=lora_targets), fp8)
        summary = dict(report.summary_lines())["LoRA base"]
    else:
        summary = FusedFP8(fp8).convert(model).summary_line()
    assert "fast backward accumulation (not the lm_head's)" in summary
    ids = torch.randint(0, vocab, (2, 16))
    loss = model(ids, targets=ids)
    with RecordScaledMM() as backward:
        loss.backward()
    head = [fast for shape, fast in backward.calls if vocab in shape]
    others = [fast for shape, fast in backward.calls if vocab not in shape]
    # dx and dW when the head trains; dx alone for a frozen head, one per block of rows where it computes the loss
    expected = {None: 2, "attn": head_module.LOGITS_ROW_BLOCKS, "attn,lm_head": 1}[lora_targets]
    assert head == [False] * expected
    assert others and all(others)
