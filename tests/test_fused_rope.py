"""Attention's q/k/v projections and RoPE as one FP8 unit (--fp8_fused_rope): the gradient producer against autograd
of RotaryEmbedding and against SiteScaling's own cast, the unit against the shared-input group it replaces (values,
gradients and recordings), with and without token positions. CPU runs the torch reference producer; the Triton
kernel is compared with it on the GPU (marked)."""

from __future__ import annotations

import re

import pytest
import torch
from numerics import assert_recorded, sqnr_db
from test_fused_swiglu import assert_same_bits

from cs336_basics.config import FP8Config, ModelConfig
from cs336_basics.kernels import rope_reference as reference
from cs336_basics.model.attention import CausalSelfAttention
from cs336_basics.model.layers import RotaryEmbedding
from cs336_basics.precision import FusedFP8
from cs336_basics.precision.fused.qkv_rope import Fp8QkvRope
from cs336_basics.precision.fused.scaling import E5M2, GRAD, INPUT, WEIGHT, SiteScaling, amax_to_scale

DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fn, E5M2)


def attention_grad(batch: int, heads: int, seq: int, head_dim: int, device: str = "cpu", layout: str = "bshd"):
    """A gradient as attention hands it back: (batch, heads, seq, head_dim), stored token-major ("bshd", a transposed
    view) or head-major ("bhsd", contiguous)."""
    gen = torch.Generator(device).manual_seed(0)
    shape = (batch, seq, heads, head_dim) if layout == "bshd" else (batch, heads, seq, head_dim)
    g = torch.randn(shape, device=device, generator=gen).mul(3).to(torch.bfloat16)
    return g.transpose(1, 2) if layout == "bshd" else g


@pytest.mark.parametrize("with_positions", [False, True])
def test_reference_gradient_is_autograd_of_rotary_embedding(with_positions):
    rope = RotaryEmbedding(16, 64)
    grad = attention_grad(2, 3, 10, 16)
    positions = torch.randint(0, 64, (2, 10)) if with_positions else None
    x = torch.randn(2, 3, 10, 16).to(torch.bfloat16).requires_grad_()
    rope(x, None if positions is None else positions[:, None, :]).backward(grad)
    expected = x.grad.transpose(1, 2).reshape(20, 48)
    assert torch.equal(reference.rope_grad(grad, rope.cos, rope.sin, positions, rotate=True), expected)
    assert torch.equal(reference.rope_grad(grad, rope.cos, rope.sin, positions, rotate=False),
                       grad.transpose(1, 2).reshape(20, 48))  # fmt: skip


@pytest.mark.parametrize("rows", [20, 8])  # a buffer per token; fewer entries than tokens (rows fold onto them)
def test_reference_cast_records_into_the_sites_buffers_as_its_own_cast(rows):
    rope = RotaryEmbedding(16, 64)
    grad = attention_grad(2, 3, 10, 16)
    g = reference.rope_grad(grad, rope.cos, rope.sin, None, rotate=True)
    scale = amax_to_scale(g.abs().amax().float() / 4, E5M2).reshape(1)  # a quarter of the range: some saturate
    sites = [SiteScaling(DTYPES, delayed=True) for _ in range(2)]
    for site in sites:
        site._register_row_buffers("grad", rows, None)
        site.scale[GRAD] = scale[0]
        site.accumulate(GRAD, torch.full((1,), 0.5), torch.ones(1, dtype=torch.int32))  # an earlier cast's
    expected, _ = sites[0].cast(g, GRAD, record=True)
    joint, g8_t, *_ = cast_as_q(grad, rope, scale, True, sites[1].row_buffers(GRAD))
    g8 = joint[:, : g.shape[1]]
    assert torch.equal(g8.view(torch.uint8), expected.view(torch.uint8)) and torch.equal(g8_t, g8.t())
    assert sites[1].amax[GRAD] == sites[0].amax[GRAD] == g.abs().max()
    assert sites[1].saturated[GRAD] == sites[0].saturated[GRAD] > 1
    if rows == 20:  # one entry per token: the same entries
        assert torch.equal(sites[0].amax_grad, sites[1].amax_grad)
    assert reference.rope_grad_amax(grad, rope.cos, rope.sin, None, True).item() == g.abs().max().item()
    untouched = [buffer.clone() for buffer in sites[1].row_buffers(GRAD)]
    cast_as_q(grad, rope, scale, False, sites[1].row_buffers(GRAD))
    assert all(map(torch.equal, untouched, sites[1].row_buffers(GRAD)))


def cast_as_q(grad, rope, scale, record, q_rows):
    """reference.rope_grad_cast_qkv with `grad` as q's gradient (and k's and v's), cast by `scale` (as its own and
    as its joint scale) and recorded into `q_rows`; k's and v's recordings go to buffers of their own."""
    rows = [*q_rows, *(torch.zeros_like(buffer) for buffer in (*q_rows, *q_rows))]
    return reference.rope_grad_cast_qkv(grad, grad, grad, rope.cos, rope.sin, None, scale.repeat(3), scale.repeat(3),
                                        E5M2, record, [False] * 3, True, *rows)  # fmt: skip


def attention_pair(fp8: FP8Config, kv_heads: int = 2, seq: int = 16, device: str = "cpu"):
    """The same attention layer converted to FP8 twice: as a shared-input group rotated by the attention, and as one
    q/k/v + RoPE unit; and the layer left in BF16."""
    config = ModelConfig(vocab_size=64, context_length=seq, dim=64, n_layers=1, n_heads=4, n_kv_heads=kv_heads,
                         intermediate_size=64)  # fmt: skip
    torch.manual_seed(0)
    layers = [torch.nn.Sequential(CausalSelfAttention(config)).to(device, torch.bfloat16) for _ in range(3)]
    layers[1].load_state_dict(layers[0].state_dict())
    layers[2].load_state_dict(layers[0].state_dict())
    FusedFP8(FP8Config(**{**vars(fp8), "fp8_fused_rope": False})).convert(layers[0])
    FusedFP8(fp8).convert(layers[1])
    assert layers[0][0].qkv is not None and isinstance(layers[1][0].qkv_rope, Fp8QkvRope)
    return layers[0][0], layers[1][0], layers[2][0]


@pytest.mark.parametrize("scaling", ["dynamic", "delayed"])
@pytest.mark.parametrize("kv_heads, with_positions", [(4, False), (2, True)])
def test_fused_unit_is_the_group_it_replaces_but_for_the_joint_input_gradient(scaling, kv_heads, with_positions):
    # Its values, weight gradients and recordings are the group's, bit for bit. Its input gradient is one GEMM over the
    # three gradients side by side, each cast by a scale that gives every (gradient, weight) pair one product of
    # inverse scales, none above its own (linear.joint_dgrad_scales): other roundings than the group's three GEMMs,
    # so both are held to the BF16 layer's.
    fp8 = FP8Config(use_fp8=True, fp8_emulate=True, fp8_path="fused", fp8_scaling=scaling)
    plain, fused, bf16 = attention_pair(fp8, kv_heads)
    x = torch.randn(3, 16, 64, dtype=torch.bfloat16)
    positions = torch.randint(0, 16, (3, 16)) if with_positions else None
    xs = [x.clone().requires_grad_() for _ in range(3)]
    ys = [layer(x_i, positions) for layer, x_i in zip((plain, fused, bf16), xs, strict=True)]
    upstream = torch.randn_like(ys[0])
    for y in ys:
        (y.float() * upstream).sum().backward()
    assert torch.equal(ys[0], ys[1])
    for name in ("q_proj", "k_proj", "v_proj", "output_proj"):
        assert torch.equal(getattr(plain, name).weight.grad, getattr(fused, name).weight.grad), name
    assert not torch.equal(xs[0].grad, xs[1].grad)  # the joint GEMM ran
    assert sqnr_db(xs[2].grad, xs[1].grad) > sqnr_db(xs[2].grad, xs[0].grad) - 2
    if scaling == "delayed":
        for site_plain, site_fused in zip(plain.qkv.scalings, fused.qkv_rope.scalings, strict=True):
            for role in (INPUT, WEIGHT, GRAD):
                assert torch.equal(site_plain.amax[role], site_fused.amax[role])
                assert torch.equal(site_plain.saturated[role], site_fused.saturated[role])
            assert site_fused.amax[GRAD] > 0


def test_positions_in_the_fused_unit_move_the_rotation_as_in_bf16():
    fp8 = FP8Config(use_fp8=True, fp8_emulate=True, fp8_path="fused")
    _, fused, _ = attention_pair(fp8)
    x = torch.randn(1, 8, 64, dtype=torch.bfloat16)
    shifted = torch.arange(8) + 3  # within the table of 16 positions
    assert not torch.equal(fused(x), fused(x, shifted))
    # Relative positions are what attention sees: a shift of every position changes nothing beyond rounding.
    assert sqnr_db(fused(x).float(), fused(x, shifted).float()) > 25


# ---- GPU: the Triton kernel against the reference ----


def gpu_row_buffers(rows: int, sites: int = 3) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each site's (amax, saturated) row buffers on the GPU, already holding earlier recordings."""
    return [(torch.rand(rows, device="cuda"), torch.randint(0, 9, (rows,), device="cuda", dtype=torch.int32))
            for _ in range(sites)]  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize(
    "shape, kv_heads, with_positions",
    # k's and v's gradients as wide as q's, then narrower (GQA): the one launch's column tiles beyond their width
    [((2, 14, 300, 64), 14, False), ((3, 4, 128, 128), 4, True), ((2, 14, 300, 64), 2, True)],
)
def test_gpu_triton_producer_matches_the_reference(layout, shape, kv_heads, with_positions):
    from cs336_basics.kernels import rope_triton as triton_ops

    batch, heads, seq, head_dim = shape
    rope = RotaryEmbedding(head_dim, 512).cuda()
    grad = attention_grad(*shape, device="cuda", layout=layout)
    positions = torch.randint(0, 512, (batch, seq), device="cuda") if with_positions else None
    for rotate in (True, False):
        args = (grad, rope.cos, rope.sin, positions, rotate)
        torch.testing.assert_close(triton_ops.rope_grad_amax(*args), reference.rope_grad_amax(*args), rtol=1e-2, atol=0)
    # As q's (rotated back), k's (rotated back, four times larger) and v's gradients, each cast by its own scale, for
    # half its amax: some values saturate.
    kv = attention_grad(batch, kv_heads, seq, head_dim, device="cuda", layout=layout)
    grads = (grad, kv * 4, kv)
    scales = torch.cat([
        amax_to_scale(reference.rope_grad_amax(g, rope.cos, rope.sin, positions, i < 2) / 2, E5M2)
        for i, g in enumerate(grads)
    ])  # fmt: skip
    joint_scales = scales / torch.tensor([1.0, 4.0, 16.0], device="cuda")  # as joint_dgrad_scales can make them
    for record in (False, True):
        for rows in (batch * seq, 100):
            tested_rows = gpu_row_buffers(rows)
            before = [(amax.clone(), saturated.clone()) for amax, saturated in tested_rows]
            expected_rows = [(amax.clone(), saturated.clone()) for amax, saturated in tested_rows]
            cast_args = (*grads, rope.cos, rope.sin, positions, scales, joint_scales, E5M2, record, [False] * 3, True)
            tested = triton_ops.rope_grad_cast_qkv(*cast_args, *[b for site in tested_rows for b in site])
            expected = reference.rope_grad_cast_qkv(*cast_args, *[b for site in expected_rows for b in site])
            for test, ref in zip(tested, expected, strict=True):  # the three side by side, then each transpose
                assert_same_bits(test, ref)
            for site, site_before, site_expected in zip(tested_rows, before, expected_rows, strict=True):
                # The kernel files each tile's recording in one entry, the reference each row's: the same totals.
                # A value at the edge of the range may saturate in one and not the other (its last bit).
                amax = site_expected[0].max().item()
                saturated = int((site_expected[1] - site_before[1]).sum())
                assert_recorded(site, site_before, amax, saturated, saturated_tolerance=2)
                if record:
                    assert site[0].sum() > site_before[0].sum() and site[1].sum() > site_before[1].sum()
                else:
                    assert torch.equal(site[0], site_before[0]) and torch.equal(site[1], site_before[1])


@pytest.mark.gpu
@pytest.mark.parametrize("with_positions", [False, True])
@pytest.mark.parametrize("keep_bf16", [[True, True, True], [True, False, True], [False, False, False]])
def test_gpu_frozen_base_producer_writes_the_same_fp8_side_by_side_and_keeps_the_bf16_gradients(
    keep_bf16, with_positions
):
    # A frozen base's form (lora/layers.py): no transposes, the rotated BF16 gradients where asked.
    from cs336_basics.kernels import rope_triton as triton_ops

    batch, seq, head_dim, heads = 2, 300, 64, (14, 2, 2)
    rope = RotaryEmbedding(head_dim, 512).cuda()
    grads = [attention_grad(batch, n, seq, head_dim, device="cuda") * 4**i for i, n in enumerate(heads)]
    positions = torch.randint(0, 512, (1, seq), device="cuda") if with_positions else None  # one row for the batch
    scales = torch.cat([
        amax_to_scale(reference.rope_grad_amax(grad, rope.cos, rope.sin, positions, i < 2) / 2, E5M2)
        for i, grad in enumerate(grads)
    ])  # fmt: skip
    rows = [[(torch.zeros(batch * seq, device="cuda"), torch.zeros(batch * seq, device="cuda", dtype=torch.int32))
             for _ in grads] for _ in range(2)]  # fmt: skip
    cast_args = (*grads, rope.cos, rope.sin, positions, scales, scales / 8, E5M2, True, keep_bf16, False)
    tested = triton_ops.rope_grad_cast_qkv(*cast_args, *[b for site in rows[0] for b in site])
    expected = reference.rope_grad_cast_qkv(*cast_args, *[b for site in rows[1] for b in site])
    assert tested[0].shape == (batch * seq, sum(heads) * head_dim) and tested[0].is_contiguous()
    assert_same_bits(tested[0], expected[0])
    for i, keep in enumerate(keep_bf16):
        if keep:
            assert_same_bits(tested[1 + i], expected[1 + i])
        else:
            assert tested[1 + i].numel() == 0
        assert rows[0][i][0].max() == rows[1][i][0].max()


@pytest.mark.gpu
@pytest.mark.parametrize(
    "record, keep_bf16, transposed", [(True, [False] * 3, True), (False, [True, False, True], False)]
)
def test_gpu_compiled_producer_is_one_launch_that_copies_nothing(record, keep_bf16, transposed):
    # Compiled, the op is traced (a triton_op) and inductor launches its one kernel from its own wrapper. Three
    # launches into the joint matrix were three functional mutations, between which inductor copied the matrix: any
    # copy would be a kernel of inductor's and a second FP8 buffer of the joint matrix's shape.
    from torch._inductor.utils import run_and_get_code

    from cs336_basics.kernels import rope_triton as triton_ops

    batch, seq, head_dim, heads = 2, 300, 64, (14, 2, 2)
    rope = RotaryEmbedding(head_dim, 512).cuda()
    grads = [attention_grad(batch, n, seq, head_dim, device="cuda") * 4**i for i, n in enumerate(heads)]
    positions = torch.randint(0, 512, (batch, seq), device="cuda")
    scales = torch.cat([
        amax_to_scale(reference.rope_grad_amax(grad, rope.cos, rope.sin, positions, i < 2) / 2, E5M2)
        for i, grad in enumerate(grads)
    ])  # fmt: skip
    cast_args = (*grads, rope.cos, rope.sin, positions, scales, scales / 8, E5M2, record, keep_bf16, transposed)
    rows = [b for site in gpu_row_buffers(batch * seq) for b in site]
    compiled_rows = [b.clone() for b in rows]

    def produce(*rows):
        return triton_ops.rope_grad_cast_qkv(*cast_args, *rows)

    expected = produce(*rows)
    with torch._inductor.config.patch(force_disable_caches=True):
        tested, (code, *_) = run_and_get_code(torch.compile(produce, fullgraph=True, dynamic=False), *compiled_rows)
    launches = re.findall(r"^\s*(\w+)\.run\(", code, flags=re.MULTILINE)
    assert len(launches) == 1 and launches[0].startswith("_rope_grad_qkv_kernel"), launches
    joint_shape = f"({batch * seq}, {sum(heads) * head_dim})"
    assert len([line for line in code.splitlines() if "= empty_strided_" in line and joint_shape in line]) == 1
    for test, ref in zip((*tested, *compiled_rows), (*expected, *rows), strict=True):  # the same kernel as eager
        assert test.shape == ref.shape and torch.equal(test.view(torch.uint8), ref.view(torch.uint8))


@pytest.mark.gpu
@pytest.mark.parametrize("scaling", ["dynamic", "delayed"])
def test_gpu_compiled_fused_unit_matches_the_group_it_replaces(scaling):
    fp8 = FP8Config(use_fp8=True, fp8_path="fused", fp8_scaling=scaling)
    plain, fused, _ = attention_pair(fp8, kv_heads=2, seq=256, device="cuda")
    for module in (plain, fused):
        for site in module.modules():
            if isinstance(site, SiteScaling) and site.delayed:
                site.size_row_buffers(4 * 256)
    x = torch.randn(4, 256, 64, device="cuda", dtype=torch.bfloat16)
    xs = (x.clone().requires_grad_(), x.clone().requires_grad_())
    ys = (torch.compile(plain, fullgraph=True)(xs[0]), torch.compile(fused, fullgraph=True)(xs[1]))
    upstream = torch.randn_like(ys[0])
    for y in ys:
        (y.float() * upstream).sum().backward()
    assert sqnr_db(ys[0], ys[1]) > 40 and sqnr_db(xs[0].grad, xs[1].grad) > 30
    for name in ("q_proj", "k_proj", "v_proj"):
        assert sqnr_db(getattr(plain, name).weight.grad, getattr(fused, name).weight.grad) > 30, name
