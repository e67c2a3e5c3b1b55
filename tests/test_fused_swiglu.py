"""The fused FP8 SwiGLU block (--fp8_fused_swiglu): its producers against their definition, the block against the BF16
SwiGLU (values and gradients), and which scalings record what. CPU runs the torch reference producers; the Triton
kernels are compared with them on the GPU (marked)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from numerics import assert_recorded, sqnr_db

from cs336_basics.kernels import swiglu_reference as reference
from cs336_basics.model.layers import SwiGLU
from cs336_basics.precision.fused.scaling import E4M3, E5M2, GRAD, INPUT, SiteScaling, amax_to_scale, fp8_max
from cs336_basics.precision.fused.swiglu import Fp8SwiGLU

DTYPES = (E4M3, E4M3, E5M2)


def activations(m: int, f: int, device: str = "cpu", seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator(device).manual_seed(seed)
    return tuple(torch.randn(m, f, device=device, generator=gen).mul(2).to(torch.bfloat16) for _ in range(3))


def fused_pair(delayed: bool = False, device: str = "cpu") -> tuple[SwiGLU, Fp8SwiGLU]:
    torch.manual_seed(0)
    bf16 = SwiGLU(64, 160).to(device=device, dtype=torch.bfloat16)
    for layer in (bf16.w1, bf16.w2, bf16.w3):
        torch.nn.init.normal_(layer.weight, std=0.05)
    copy = SwiGLU(64, 160).to(device=device, dtype=torch.bfloat16)
    copy.load_state_dict(bf16.state_dict())
    scalings = tuple(SiteScaling(DTYPES, delayed=delayed, device=device) for _ in range(3))
    return bf16, Fp8SwiGLU(copy.w1, copy.w2, copy.w3, scalings)


def test_reference_gradients_are_autograd_of_the_bf16_swiglu():
    dg, h1, h3 = activations(37, 53)
    h1.requires_grad_(), h3.requires_grad_()
    (F.silu(h1) * h3).backward(dg)
    dh1, dh3 = reference.swiglu_grads(dg, h1.detach(), h3.detach())
    assert torch.equal(dh1, h1.grad) and torch.equal(dh3, h3.grad)


def row_buffers(rows: int = 8, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """A site's (amax, saturated) row buffers, already holding earlier recordings."""
    gen = torch.Generator(device).manual_seed(1)
    amax = torch.rand(rows, device=device, generator=gen)
    return amax, torch.randint(0, 9, (rows,), device=device, generator=gen, dtype=torch.int32)


def test_reference_cast_writes_the_transpose_and_counts_saturations():
    _, h1, h3 = activations(37, 53)
    g = reference.swiglu(h1, h3).float()
    amax = reference.swiglu_amax(h1, h3)
    assert amax.item() == g.abs().max().item()
    scale = amax_to_scale(amax / 4, E4M3)  # a scale for a quarter of the range: the largest values saturate
    buffers = row_buffers()
    before = tuple(b.clone() for b in buffers)
    g8, g8_t = reference.swiglu_cast(h1, h3, scale, E4M3, True, *buffers)
    assert g8.dtype == E4M3 and torch.equal(g8_t, g8.t())
    count = int((g.abs() * scale > 448).sum())
    assert count > 0 and amax.item() > before[0].max().item()
    assert_recorded(buffers, before, amax.item(), count)
    assert g8.float().abs().max().item() == 448  # saturated at the FP8 max, never inf
    reference.swiglu_cast(h1, h3, scale, E4M3, False, *buffers)
    assert_recorded(buffers, before, amax.item(), count)  # not recording: untouched


def test_fused_block_matches_the_bf16_swiglu_values_and_gradients():
    bf16, fp8 = fused_pair()
    x = torch.randn(4, 24, 64, dtype=torch.bfloat16)
    xs = (x.clone().requires_grad_(), x.clone().requires_grad_())
    ys = (bf16(xs[0]), fp8(xs[1]))
    upstream = torch.randn_like(ys[0])
    for y in ys:
        (y.float() * upstream).sum().backward()
    assert ys[1].shape == ys[0].shape and sqnr_db(ys[0], ys[1]) > 20
    assert sqnr_db(xs[0].grad, xs[1].grad) > 18
    for name in ("w1", "w2", "w3"):
        assert sqnr_db(getattr(bf16, name).weight.grad, getattr(fp8, name).weight.grad) > 18, name


def test_delayed_block_records_each_tensor_in_its_sites_role_and_only_in_training():
    _, fp8 = fused_pair(delayed=True)
    s1, s3, s2 = fp8.scalings
    x = torch.randn(2, 8, 64, dtype=torch.bfloat16)
    fp8.eval()
    fp8(x.requires_grad_()).sum().backward()
    assert all(not s.amax.any() for s in (s1, s3, s2))
    fp8.train()
    fp8(x).sum().backward()
    # The block's h1 and h3: GEMMs of x and the weights in E4M3 (scale 1 before any history), not BF16's, whose g has
    # an amax some percent off (FP8's rounding: up to 8% over 40 draws of x). Products and sums of these E4M3
    # values are multiples of 2^-18 below 2^6 (the bound asserted), exact in fp32: the block's h is the exact product
    # rounded once to BF16 whatever the GEMM's order of summation, as is this one.
    x8, w1_8, w3_8 = (t.detach().to(E4M3).double() for t in (x.reshape(-1, 64), fp8.w1.weight, fp8.w3.weight))
    assert max((x8.abs() @ w.abs().t()).max().item() for w in (w1_8, w3_8)) < 2**6
    h1, h3 = ((x8 @ w.t()).to(torch.bfloat16) for w in (w1_8, w3_8))
    # w2's input is the SwiGLU output, written by the producer; w1 and w3 get their output gradients from it too.
    assert s2.amax[INPUT].item() == reference.swiglu(h1, h3).abs().max().item()
    assert s1.amax[GRAD] > 0 and s3.amax[GRAD] > 0 and s2.amax[GRAD] > 0
    assert s1.amax[INPUT] > 0 and s3.amax[INPUT] == 0  # x is cast once, by w1's site
    # Scale 1 before any history: values beyond E4M3's range would have been counted.
    assert s2.saturated[INPUT].item() == int((reference.swiglu(h1, h3).float().abs() > 448).sum())


# ---- GPU: the Triton kernels against the reference ----


def assert_same_bits(test: torch.Tensor, ref: torch.Tensor) -> None:
    """Low-precision (FP8 or BF16) tensors equal up to the rare value where the kernel's fp32 arithmetic and torch's
    differ in the last bit (a different silu, or a multiply-add the GPU contracts into one rounding) and that
    difference survives the rounding to the output's precision."""
    assert test.dtype == ref.dtype and test.shape == ref.shape
    as_ints = {1: torch.uint8, 2: torch.int16}[test.element_size()]
    differ = (test.view(as_ints) != ref.view(as_ints)).float().mean().item()
    assert differ < 1e-3, f"{differ:.2%} of the values differ"
    assert sqnr_db(ref.float(), test.float()) > 40


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(300, 200), (1024, 3584)])
@pytest.mark.parametrize("record, transposed", [(False, True), (True, True), (False, False)])
def test_gpu_triton_producers_match_the_reference(shape, record, transposed):
    from cs336_basics.kernels import swiglu_triton as triton_ops

    dg, h1, h3 = activations(*shape, device="cuda")
    amax = reference.swiglu_amax(h1, h3)
    torch.testing.assert_close(triton_ops.swiglu_amax(h1, h3), amax, rtol=1e-2, atol=0)
    scale = amax_to_scale(amax / 2, E4M3)  # some values saturate
    tested_rows, expected_rows = row_buffers(shape[0], "cuda"), row_buffers(shape[0], "cuda")
    before = tuple(b.clone() for b in tested_rows)
    tested = triton_ops.swiglu_cast(h1, h3, scale, E4M3, record, *tested_rows, transposed)
    expected = reference.swiglu_cast(h1, h3, scale, E4M3, record, *expected_rows, transposed)
    assert_same_outputs(tested, expected)
    g = reference.swiglu(h1, h3).float()
    count = int((g.abs() * scale > 448).sum()) if record else 0
    assert_recorded(tested_rows, before, amax.item() if record else 0.0, count, saturated_tolerance=2)
    assert not record or count > 0

    grad_amax = reference.swiglu_grad_amax(dg, h1, h3)
    torch.testing.assert_close(triton_ops.swiglu_grad_amax(dg, h1, h3), grad_amax, rtol=1e-2, atol=0)
    # Compiled too, on freed memory full of large values: every slot of the first pass must be written.
    compiled_amax = torch.compile(triton_ops.swiglu_grad_amax, fullgraph=True)
    freed = [torch.full((1 << n,), 1e30, device="cuda") for n in range(10, 16)]
    del freed
    torch.testing.assert_close(compiled_amax(dg, h1, h3), grad_amax, rtol=1e-2, atol=0)
    scales = amax_to_scale(grad_amax / 2, E5M2)
    tested_rows = [row_buffers(shape[0], "cuda") for _ in range(2)]
    before = [tuple(b.clone() for b in rows) for rows in tested_rows]
    joint_scales = scales / torch.tensor([1.0, 16.0], device="cuda")  # as joint_dgrad_scales can make them
    tested = triton_ops.swiglu_grad_cast(dg, h1, h3, scales, joint_scales, E5M2, record, *tested_rows[0],
                                         *tested_rows[1], transposed)  # fmt: skip
    expected_rows = [row_buffers(shape[0], "cuda") for _ in range(2)]
    expected = reference.swiglu_grad_cast(dg, h1, h3, scales, joint_scales, E5M2, record, *expected_rows[0],
                                          *expected_rows[1], transposed)  # fmt: skip
    assert_same_outputs(tested, expected)
    counts = assert_grads_recorded_against_own_scales(dg, h1, h3, scales, tested_rows, before, record)
    assert not record or all(count > 0 for count in counts)


@pytest.mark.gpu
@pytest.mark.parametrize("record", [False, True])
def test_gpu_gradient_producer_casts_dh1_and_dh3_side_by_side_by_their_joint_scales(record):
    # As a frozen base runs it (lora/layers.py: no transposes): own scales four binades apart, the joint ones two below
    # them (as linear.joint_dgrad_scales can make them), the recordings against the own ones.
    from cs336_basics.kernels import swiglu_triton as triton_ops

    shape = (300, 200)
    dg, h1, h3 = activations(*shape, device="cuda")
    scales = amax_to_scale(reference.swiglu_grad_amax(dg, h1, h3) / torch.tensor([2.0, 0.125], device="cuda"), E5M2)
    tested_rows = [row_buffers(shape[0], "cuda") for _ in range(2)]
    before = [tuple(b.clone() for b in rows) for rows in tested_rows]
    tested = triton_ops.swiglu_grad_cast(dg, h1, h3, scales, scales / 4, E5M2, record, *tested_rows[0], *tested_rows[1],
                                         False)  # fmt: skip
    expected_rows = [row_buffers(shape[0], "cuda") for _ in range(2)]
    expected = reference.swiglu_grad_cast(dg, h1, h3, scales, scales / 4, E5M2, record, *expected_rows[0],
                                          *expected_rows[1], False)  # fmt: skip
    assert tested[0].shape == (shape[0], 2 * shape[1]) and tested[0].is_contiguous()
    assert_same_outputs(tested, expected)
    assert_grads_recorded_against_own_scales(dg, h1, h3, scales, tested_rows, before, record)


def assert_grads_recorded_against_own_scales(dg, h1, h3, scales, tested_rows, before, record) -> list[int]:
    """dh1's and dh3's recordings: each one's amax, and its saturations counted against its own scale (none without
    `record`). Returns the counts."""
    counts = []
    for grad, scale_k, rows, rows_before in zip(reference.swiglu_grads(dg, h1, h3), scales, tested_rows, before,
                                                 strict=True):  # fmt: skip
        magnitude = grad.float().abs()
        count = int((magnitude * scale_k > fp8_max(E5M2)).sum()) if record else 0
        assert_recorded(rows, rows_before, magnitude.max().item() if record else 0.0, count, saturated_tolerance=2)
        counts.append(count)
    return counts


def assert_same_outputs(tested, expected) -> None:
    for test, ref in zip(tested, expected, strict=True):
        if test.numel() == 0:  # not transposed: nothing written
            assert ref.numel() == 0
        else:
            assert_same_bits(test, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("delayed", [False, True])
def test_gpu_compiled_triton_block_matches_the_reference_block(delayed):
    bf16, fp8 = fused_pair(delayed=delayed, device="cuda")
    assert fp8.producers == "Triton kernels"
    x = torch.randn(8, 128, 64, device="cuda", dtype=torch.bfloat16)
    compiled = torch.compile(fp8, fullgraph=True)
    xs = (x.clone().requires_grad_(), x.clone().requires_grad_())
    y_ref = bf16(xs[0])
    y = compiled(xs[1])
    upstream = torch.randn_like(y)
    (y_ref.float() * upstream).sum().backward()
    (y.float() * upstream).sum().backward()
    assert sqnr_db(y_ref, y) > 20 and sqnr_db(xs[0].grad, xs[1].grad) > 18
    for name in ("w1", "w2", "w3"):
        assert sqnr_db(getattr(bf16, name).weight.grad, getattr(fp8, name).weight.grad) > 18, name
