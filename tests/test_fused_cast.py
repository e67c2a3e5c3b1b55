"""The weight's cast with its transposed copy in one kernel (delayed scaling on CUDA): the torch reference against
cast_to_fp8 and the site's cast and transpose (CPU), the Triton kernel against the reference and an FP8 linear that
runs it under torch.compile (GPU, marked)."""

from __future__ import annotations

import pytest
import torch

from cs336_basics.kernels import cast_reference as reference
from cs336_basics.precision.fused.linear import Fp8Linear
from cs336_basics.precision.fused.scaling import E4M3, E5M2, WEIGHT, SiteScaling, amax_to_scale, cast_to_fp8

DTYPES = (E4M3, E4M3, E5M2)


def weight(m: int, f: int, device: str = "cpu", seed: int = 0) -> torch.Tensor:
    gen = torch.Generator(device).manual_seed(seed)
    return (torch.randn(m, f, device=device, generator=gen) * 0.05).to(torch.bfloat16)


def row_buffers(rows: int, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Row buffers holding earlier recordings, below this test's amax."""
    gen = torch.Generator(device).manual_seed(1)
    amax = torch.rand(rows, device=device, generator=gen) * 0.01
    return amax, torch.randint(0, 9, (rows,), device=device, dtype=torch.int32, generator=gen)


def saturating_scale(x: torch.Tensor, dtype: torch.dtype = E4M3) -> torch.Tensor:
    """A 0-d view into a (3,) buffer, as SiteScaling's `scale[role]`, covering half of x's range: the largest values
    saturate."""
    scales = torch.ones(3, device=x.device)
    scales[WEIGHT] = amax_to_scale(x.abs().amax() / 2, dtype)
    return scales[WEIGHT]


# ---- CPU: the reference ----


@pytest.mark.parametrize("dtype", [E4M3, E5M2])
def test_reference_casts_transposes_and_records_into_entry_zero(dtype):
    x = weight(37, 53)
    scale = saturating_scale(x, dtype)
    amax_rows, saturated_rows = row_buffers(16)
    before = (amax_rows.clone(), saturated_rows.clone())
    x8, x8_t = reference.cast_transposed(x, scale, dtype, True, amax_rows, saturated_rows)
    expected = cast_to_fp8(x, scale, dtype)
    assert torch.equal(x8.view(torch.uint8), expected.view(torch.uint8))
    assert x8_t.is_contiguous() and torch.equal(x8_t.view(torch.uint8), expected.view(torch.uint8).t())
    saturated = int((x.abs().float() * scale > torch.finfo(dtype).max).sum())
    assert saturated > 0 and x8.float().abs().max().item() == torch.finfo(dtype).max  # saturated, never inf
    assert amax_rows[0].item() == x.abs().max().item() and saturated_rows[0].item() == before[1][0].item() + saturated
    assert torch.equal(amax_rows[1:], before[0][1:]) and torch.equal(saturated_rows[1:], before[1][1:])
    # A second call max-accumulates its amax and adds its count.
    reference.cast_transposed(x * 2, scale, dtype, True, amax_rows, saturated_rows)
    more = int((x.abs().float() * 2 * scale > torch.finfo(dtype).max).sum())
    assert amax_rows[0].item() == 2 * x.abs().max().item() and more > saturated
    assert saturated_rows[0].item() == before[1][0].item() + saturated + more


def test_reference_without_recording_leaves_the_buffers_alone():
    x = weight(37, 53)
    amax_rows, saturated_rows = row_buffers(16)
    before = (amax_rows.clone(), saturated_rows.clone())
    reference.cast_transposed(x, saturating_scale(x).reshape(1), E4M3, False, amax_rows, saturated_rows)
    assert torch.equal(amax_rows, before[0]) and torch.equal(saturated_rows, before[1])


@pytest.mark.parametrize("delayed", [False, True])
@pytest.mark.parametrize("record", [False, True])
def test_site_cast_transposed_is_its_cast_and_transpose_on_the_cpu(delayed, record):
    x = weight(48, 64)
    sites = [SiteScaling(DTYPES, delayed=delayed, weight_rows=48) for _ in range(2)]
    if delayed:
        for site in sites:
            site.scale[WEIGHT] = saturating_scale(x)
    x8, x8_t, scale_inv = sites[0].cast_transposed(x, WEIGHT, record)
    expected, expected_inv = sites[1].cast(x, WEIGHT, record)
    assert torch.equal(x8.view(torch.uint8), expected.view(torch.uint8)) and torch.equal(scale_inv, expected_inv)
    assert torch.equal(x8_t.view(torch.uint8), sites[1].transposed(expected).view(torch.uint8))
    if delayed:
        assert all(map(torch.equal, sites[0].row_buffers(WEIGHT), sites[1].row_buffers(WEIGHT)))
        assert (sites[0].saturated[WEIGHT].item() > 0) == record


def test_the_kernels_op_refuses_what_it_cannot_cast():
    pytest.importorskip("triton")
    from cs336_basics.kernels.cast_triton import cast_transposed

    x = weight(8, 8)
    empty = (torch.empty(0), torch.empty(0, dtype=torch.int32))
    with pytest.raises(ValueError, match="CUDA"):
        cast_transposed(x, torch.ones(()), E4M3, False, *empty)


@pytest.mark.parametrize("delayed, record", [(True, True), (True, False), (False, True)])
def test_producer_rows_are_the_sites_buffers_only_when_recording(delayed, record):
    site = SiteScaling(DTYPES, delayed=delayed, weight_rows=48)
    like = torch.zeros(2, dtype=torch.bfloat16)
    amax_rows, saturated_rows = site.producer_rows(WEIGHT, record, like)
    if delayed and record:  # the buffers themselves, which the kernel fills in place
        assert all(a is b for a, b in zip((amax_rows, saturated_rows), site.row_buffers(WEIGHT), strict=True))
    else:  # stand-ins a custom op can take and never touch
        assert amax_rows.numel() == saturated_rows.numel() == 0
        assert (amax_rows.dtype, saturated_rows.dtype) == (torch.float32, torch.int32)


# ---- GPU: the Triton kernel against the reference ----


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(300, 200), (896, 896), (3584, 896)])
@pytest.mark.parametrize("record", [False, True])
@pytest.mark.parametrize("compiled", [False, True])
def test_gpu_triton_cast_matches_the_reference(shape, record, compiled):
    from cs336_basics.kernels import cast_triton

    op = torch.compile(cast_triton.cast_transposed, fullgraph=True) if compiled else cast_triton.cast_transposed
    x = weight(*shape, device="cuda")
    scale = saturating_scale(x)
    rows = (shape[0], 16)  # a weight's out_features, or BINS
    for amax_rows, saturated_rows in (row_buffers(n, "cuda") for n in rows):
        before = (amax_rows.clone(), saturated_rows.clone())
        expected_rows = (amax_rows.clone(), saturated_rows.clone())
        for call in range(2):  # the second call accumulates onto the first's recordings
            x_call = x * (1 - 0.25 * call)
            tested = op(x_call, scale, E4M3, record, amax_rows, saturated_rows)
            expected = reference.cast_transposed(x_call, scale, E4M3, record, *expected_rows)
            for test, ref in zip(tested, expected, strict=True):
                assert test.shape == ref.shape and test.is_contiguous()
                assert torch.equal(test.view(torch.uint8), ref.view(torch.uint8))
        if record:
            assert amax_rows.max().item() == expected_rows[0].max().item() == x.abs().max().item()
            assert saturated_rows.sum().item() == expected_rows[1].sum().item() > before[1].sum().item()
            assert (amax_rows >= before[0]).all()
        else:
            assert torch.equal(amax_rows, before[0]) and torch.equal(saturated_rows, before[1])


@pytest.mark.gpu
def test_gpu_triton_cast_takes_e5m2_and_a_scale_of_shape_one():
    from cs336_basics.kernels import cast_triton

    x = weight(300, 200, device="cuda")
    scale = saturating_scale(x, E5M2).reshape(1).clone()
    amax_rows, saturated_rows = torch.zeros(16, device="cuda"), torch.zeros(16, device="cuda", dtype=torch.int32)
    tested = cast_triton.cast_transposed(x, scale, E5M2, True, amax_rows, saturated_rows)
    expected_rows = (torch.zeros(16, device="cuda"), torch.zeros(16, device="cuda", dtype=torch.int32))
    expected = reference.cast_transposed(x, scale, E5M2, True, *expected_rows)
    for test, ref in zip(tested, expected, strict=True):
        assert test.dtype == E5M2 and torch.equal(test.view(torch.uint8), ref.view(torch.uint8))
    assert amax_rows.max() == expected_rows[0].max() and saturated_rows.sum() == expected_rows[1].sum() > 0


@pytest.mark.gpu
def test_gpu_compiled_delayed_linear_casts_its_weight_with_the_kernel():
    torch.manual_seed(0)
    linears = [torch.nn.Linear(512, 768, bias=False).to(device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    linears[1].load_state_dict(linears[0].state_dict())
    layers = [
        Fp8Linear(linear, SiteScaling(DTYPES, delayed=True, device="cuda", weight_rows=768)) for linear in linears
    ]
    w = layers[0].weight.detach()
    for layer in layers:
        layer.scaling.scale[WEIGHT] = saturating_scale(w)
    assert layers[0].scaling._cast_transposed is not None
    layers[1].scaling._cast_transposed = None  # the cast and transpose as two kernels, as before
    x = torch.randn(4, 64, 512, device="cuda", dtype=torch.bfloat16)
    xs = (x.clone().requires_grad_(), x.clone().requires_grad_())
    ys = (torch.compile(layers[0], fullgraph=True)(xs[0]), layers[1](xs[1]))
    upstream = torch.randn_like(ys[0])
    for y in ys:
        (y.float() * upstream).sum().backward()
    torch.testing.assert_close(ys[0], ys[1], rtol=0, atol=0)
    torch.testing.assert_close(xs[0].grad, xs[1].grad, rtol=0, atol=0)
    torch.testing.assert_close(layers[0].weight.grad, layers[1].weight.grad)
    sites = [layer.scaling for layer in layers]
    assert sites[0].amax[WEIGHT].item() == sites[1].amax[WEIGHT].item() == w.abs().max().item()
    assert sites[0].saturated[WEIGHT].item() == sites[1].saturated[WEIGHT].item() > 0
