"""The course's functions, each against a reference written here in float64 (or torch's own op)."""

import math

import numpy as np
import pytest
import torch

import cs336_basics
import cs336_basics.course
from cs336_basics import (
    cross_entropy,
    get_batch,
    get_lr_cosine_schedule,
    gradient_clipping,
    scaled_dot_product_attention,
    silu,
    softmax,
)


def test_every_course_name_is_exported_from_the_package():
    assert sorted(cs336_basics.__all__) == sorted(cs336_basics.course.__all__)
    for name in cs336_basics.__all__:
        assert getattr(cs336_basics, name) is getattr(cs336_basics.course, name)
    with pytest.raises(AttributeError):
        cs336_basics.not_a_course_name  # noqa: B018


def grads_of(fn, *inputs, weight_seed=0):
    """Gradients of sum(fn(*inputs) * w) for a fixed random w, in float64."""
    inputs = [x.detach().double().requires_grad_(True) for x in inputs]
    out = fn(*inputs)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(weight_seed), dtype=torch.float64)
    (out * w).sum().backward()
    return [x.grad for x in inputs]


# --- softmax / silu ----------------------------------------------------------------------------------


def reference_softmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    x = x.double()
    shifted = x - x.max(dim=dim, keepdim=True).values
    return shifted.exp() / shifted.exp().sum(dim=dim, keepdim=True)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax_values_and_gradients(dim):
    x = torch.randn(3, 4, 5)
    torch.testing.assert_close(softmax(x, dim), reference_softmax(x, dim).float())
    torch.testing.assert_close(softmax(x, dim).sum(dim), torch.ones(1).expand_as(x.sum(dim)))
    ours, ref = grads_of(lambda t: softmax(t, dim), x), grads_of(lambda t: reference_softmax(t, dim), x)
    torch.testing.assert_close(ours[0], ref[0])


def test_softmax_large_inputs():
    x = torch.tensor([[1000.0, 999.0, -1000.0], [1e30, 1e30, 1e30], [-1e4, -1e4 + 1, -1e4 + 2]])
    out = softmax(x, -1)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, reference_softmax(x, -1).float())
    torch.testing.assert_close(out[1], torch.full((3,), 1 / 3))
    # Shifting every entry by the same amount changes nothing (quarters: exact in float32 after the shift).
    y = torch.randint(-20, 20, (4, 7)).float() / 4
    torch.testing.assert_close(softmax(y + 10000.0, -1), softmax(y, -1))


def test_silu_values_and_gradients():
    x = torch.linspace(-30, 30, 301).reshape(7, 43)

    def reference(t):
        return t / (1 + torch.exp(-t))

    torch.testing.assert_close(silu(x), reference(x.double()).float())
    torch.testing.assert_close(grads_of(silu, x)[0], grads_of(reference, x)[0])


# --- cross-entropy -----------------------------------------------------------------------------------


def reference_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = logits.double().reshape(-1, logits.shape[-1])
    targets = targets.reshape(-1)
    top = logits.max(dim=-1, keepdim=True).values
    log_sum_exp = top[:, 0] + (logits - top).exp().sum(-1).log()
    return (log_sum_exp - logits[torch.arange(len(targets)), targets]).mean()


@pytest.mark.parametrize("batch_shape", [(8,), (2, 3), (2, 3, 4)])
def test_cross_entropy_values_gradients_and_batch_dims(batch_shape):
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(*batch_shape, 11, generator=g)
    targets = torch.randint(0, 11, batch_shape, generator=g)
    loss = cross_entropy(logits, targets)
    assert loss.shape == ()
    torch.testing.assert_close(loss, reference_cross_entropy(logits, targets).float())
    ours = grads_of(lambda t: cross_entropy(t, targets), logits)[0]
    ref = grads_of(lambda t: reference_cross_entropy(t, targets), logits)[0]
    torch.testing.assert_close(ours, ref)


def test_cross_entropy_large_logits_and_half_precision():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(6, 50, generator=g) * 1e4
    targets = torch.randint(0, 50, (6,), generator=g)
    loss = cross_entropy(logits, targets)
    assert torch.isfinite(loss)
    torch.testing.assert_close(loss, reference_cross_entropy(logits, targets).float())
    # A confident correct prediction costs ~0, not NaN or inf.
    confident = torch.full((1, 5), -1e6)
    confident[0, 3] = 1e6
    assert cross_entropy(confident, torch.tensor([3])).item() == 0.0
    low = logits[:, :10].bfloat16() / 1e3
    loss = cross_entropy(low, targets % 10)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, reference_cross_entropy(low, targets % 10).float())


# --- attention -----------------------------------------------------------------------------------------


def reference_attention(q, k, v, mask=None):
    """One query at a time over the keys it may see, in float64; q (..., n, d), k (..., m, d), v (..., m, e)."""
    q, k, v = q.double(), k.double(), v.double()
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    n, m = q.shape[-2], k.shape[-2]
    mask = torch.ones(n, m, dtype=torch.bool) if mask is None else mask
    mask = mask.expand(*lead, n, m)
    q, k, v = q.expand(*lead, *q.shape[-2:]), k.expand(*lead, *k.shape[-2:]), v.expand(*lead, *v.shape[-2:])
    out = torch.empty(*lead, n, v.shape[-1], dtype=torch.float64)
    for index in np.ndindex(*lead, n):
        *b, i = index
        b = tuple(b)
        scores = k[b] @ q[b][i] / math.sqrt(q.shape[-1])
        scores = torch.where(mask[b][i], scores, -math.inf)
        weights = scores.exp() / scores.exp().sum() if mask[b][i].any() else scores * math.nan
        out[b][i] = weights @ v[b]
    return out


def random_mask(*shape, seed=0):
    mask = torch.rand(*shape, generator=torch.Generator().manual_seed(seed)) < 0.6
    mask[..., 0] = True  # every query may attend to something
    return mask


@pytest.mark.parametrize("lead", [(), (3,), (2, 3)])
def test_attention_shapes_values_and_gradients(lead):
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(*lead, n, d, generator=g) for n, d in ((5, 8), (7, 8), (7, 6)))
    mask = random_mask(*lead, 5, 7)
    for m in (None, mask):
        out = scaled_dot_product_attention(q, k, v, m)
        assert out.shape == (*lead, 5, 6) and out.dtype == torch.float32
        torch.testing.assert_close(out, reference_attention(q, k, v, m).float())
        ours = grads_of(lambda a, b, c, m=m: scaled_dot_product_attention(a, b, c, m), q, k, v)
        ref = grads_of(lambda a, b, c, m=m: reference_attention(a, b, c, m), q, k, v)
        for a, b in zip(ours, ref, strict=True):
            torch.testing.assert_close(a, b)


def test_attention_mask_semantics():
    g = torch.Generator().manual_seed(4)
    q, k, v = torch.randn(2, 4, 8, generator=g), torch.randn(2, 6, 8, generator=g), torch.randn(2, 6, 3, generator=g)
    mask = random_mask(4, 6, seed=5)  # broadcast over the batch
    out = scaled_dot_product_attention(q, k, v, mask)
    torch.testing.assert_close(out, reference_attention(q, k, v, mask).float())
    # Values at masked (False) keys do not matter; values at allowed (True) keys do.
    hidden = v.clone()
    hidden[:, ~mask.any(0)] += 100.0
    torch.testing.assert_close(scaled_dot_product_attention(q, k, hidden, mask), out)
    changed = v.clone()
    changed[:, 0] += 1.0  # key 0 is visible to every query
    assert not torch.allclose(scaled_dot_product_attention(q, k, changed, mask), out)
    # An all-True mask is no mask; a causal mask matches torch's causal SDPA.
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v, torch.ones(4, 6, dtype=torch.bool)),
                               scaled_dot_product_attention(q, k, v))  # fmt: skip
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    torch.testing.assert_close(
        scaled_dot_product_attention(k, k, v, causal),
        torch.nn.functional.scaled_dot_product_attention(k, k, v, is_causal=True),
    )
    # A query that may attend to nothing has no defined output.
    blind = mask.clone()
    blind[2] = False
    assert torch.isnan(scaled_dot_product_attention(q, k, v, blind)[:, 2]).all()
    with pytest.raises(TypeError, match="boolean"):
        scaled_dot_product_attention(q, k, v, mask.float())


# --- clipping ------------------------------------------------------------------------------------------


def params_with_grads(scale: float):
    g = torch.Generator().manual_seed(6)
    params = [torch.nn.Parameter(torch.randn(shape, generator=g)) for shape in [(3, 4), (5,), (2, 2, 2), (7,)]]
    for p in params[:3]:
        p.grad = torch.randn(p.shape, generator=g) * scale
    return params  # the last one has no gradient


@pytest.mark.parametrize("scale", [10.0, 0.01])
def test_gradient_clipping(scale):
    params = params_with_grads(scale)
    before = [p.grad.clone() for p in params[:3]]
    norm = math.sqrt(sum(float((g.double() ** 2).sum()) for g in before))
    returned = gradient_clipping(iter(params), 1.0)  # any iterable, consumed once
    assert returned.item() == pytest.approx(norm, rel=1e-6)
    factor = 1.0 / (norm + 1e-6) if norm > 1.0 else 1.0
    for p, g in zip(params, before, strict=False):
        torch.testing.assert_close(p.grad, g * factor)
    assert params[3].grad is None
    if norm > 1.0:
        clipped = math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in params[:3]))
        assert clipped == pytest.approx(1.0, abs=1e-5)
    # Same result as torch's clipping of the same gradients.
    torch_params = params_with_grads(scale)
    torch.nn.utils.clip_grad_norm_(torch_params, 1.0)
    for ours, theirs in zip(params[:3], torch_params[:3], strict=True):
        torch.testing.assert_close(ours.grad, theirs.grad)


def test_gradient_clipping_without_any_grads():
    params = [torch.nn.Parameter(torch.ones(3))]
    assert gradient_clipping(params, 1.0).item() == 0.0
    assert params[0].grad is None
    with pytest.raises(ValueError, match="max_l2_norm"):
        gradient_clipping(params, -1.0)


# --- schedule ------------------------------------------------------------------------------------------


def test_cosine_schedule_boundaries_and_shape():
    lr_max, lr_min, warmup, cycle = 1.0, 0.1, 7, 21

    def reference(t):
        if t < warmup:
            return lr_max * t / warmup
        if t > cycle:
            return lr_min
        return lr_min + (lr_max - lr_min) * (1 + math.cos(math.pi * (t - warmup) / (cycle - warmup))) / 2

    for t in range(30):
        assert get_lr_cosine_schedule(t, lr_max, lr_min, warmup, cycle) == pytest.approx(reference(t), abs=1e-12)
    assert get_lr_cosine_schedule(0, lr_max, lr_min, warmup, cycle) == 0.0
    assert get_lr_cosine_schedule(warmup, lr_max, lr_min, warmup, cycle) == lr_max
    assert get_lr_cosine_schedule(14, lr_max, lr_min, warmup, cycle) == pytest.approx((lr_max + lr_min) / 2)
    assert get_lr_cosine_schedule(cycle, lr_max, lr_min, warmup, cycle) == pytest.approx(lr_min)
    assert get_lr_cosine_schedule(10**6, lr_max, lr_min, warmup, cycle) == lr_min
    assert get_lr_cosine_schedule(0, lr_max, lr_min, 0, cycle) == lr_max  # no warmup


# --- batches -------------------------------------------------------------------------------------------


def test_get_batch_is_the_trainers_sampler():
    assert get_batch is cs336_basics.data.get_batch


def test_get_batch_course_semantics():
    dataset = np.arange(0, 100)
    np.random.seed(0)
    starts = []
    for _ in range(200):
        x, y = get_batch(dataset, 32, 7, "cpu")
        assert x.shape == y.shape == (32, 7) and x.device.type == "cpu"
        assert torch.equal(y, x + 1)
        starts += x[:, 0].tolist()
    # Every start from 0 to len - context_length - 1 is drawn, none beyond, roughly uniformly.
    counts = np.bincount(starts, minlength=93)
    assert len(counts) == 93 and counts.min() > 0
    assert counts.std() / counts.mean() < 0.2
    np.random.seed(0)
    again, _ = get_batch(dataset, 32, 7, "cpu")
    np.random.seed(0)
    assert torch.equal(again, get_batch(dataset, 32, 7, "cpu")[0])


@pytest.mark.parametrize("device", ["not-a-device:0", "cuda:99"])
def test_get_batch_unknown_device_is_a_torch_error(device):
    with pytest.raises(RuntimeError):
        get_batch(np.arange(100), 4, 8, device)
