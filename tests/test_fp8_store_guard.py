"""A guard against the FP8 transposed-store miscompile (GPU, marked).

Triton 3.8.0 and later can mis-lower a transposed, vectorised one-byte (FP8) store that sits in a kernel beside min/max
lowered to PTX's NaN-propagating `min.NaN`/`max.NaN`: the contiguous store of the same value is right, the
transposed one writes bytes that read as NaN/Inf, for some block sizes and warp counts only (triton-lang/triton#11111,
open). Inductor emits that min/max form since pytorch/pytorch#186933, so compiled float8 training turned NaN at random
on torch 2.14 nightlies with triton 3.8 (pytorch/pytorch#188841; torchao patches inductor's codegen around it:
pytorch/ao#4652, #4657). Triton 3.7.1 and older were not affected; the lock pins triton 3.6.0 (tests/test_stack.py).

This project writes FP8 row-major and transposed in one program in its own kernels (the weight cast, the transpose,
SwiGLU's producers, RoPE's gradient producer) and lets inductor write others (dynamic scaling's casts). Each kernel
runs here at every tile (block sizes and warp count) it may be given, in both FP8 formats, and its output must be
finite and equal to the torch reference. A triton bump that brings the bug back fails here before a run turns NaN.
"""

from __future__ import annotations

import pytest
import torch
from test_fused_swiglu import assert_same_bits

from cs336_basics.kernels import cast_reference, rope_reference, swiglu_reference
from cs336_basics.kernels.tiles import (
    ROPE_GRAD_TILE,
    SWIGLU_GRAD_TILE,
    SWIGLU_TILE,
    TRANSPOSE_TILE,
    WEIGHT_CAST_TILE,
    Tile,
)
from cs336_basics.precision.fused.scaling import E4M3, E5M2, amax_to_scale, fp8_max

pytestmark = pytest.mark.gpu

FORMATS = (E4M3, E5M2)
# Every tile the fused path's kernels are given (tiles.py) and neighbours a retuning would pick from: the bug's
# corruption depended on the block size and warp count.
PROJECT_TILES = {TRANSPOSE_TILE, SWIGLU_TILE, SWIGLU_GRAD_TILE, ROPE_GRAD_TILE, WEIGHT_CAST_TILE}
TILES = sorted(PROJECT_TILES | {Tile(64, 64, 4), Tile(128, 64, 8), Tile(64, 128, 8)})


def assert_finite_fp8(*tensors: torch.Tensor) -> None:
    for tensor in tensors:
        if tensor.dtype in FORMATS:
            bad = int((~torch.isfinite(tensor.float())).sum())
            assert bad == 0, f"{bad} NaN/Inf in an FP8 output of shape {tuple(tensor.shape)}"


def assert_equal_bytes(tested, expected) -> None:
    for test, ref in zip(tested, expected, strict=True):
        assert test.shape == ref.shape and test.dtype == ref.dtype
        assert torch.equal(test.view(torch.uint8), ref.view(torch.uint8))


def saturating_scale(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A scale covering half of x's range: the largest values saturate (the clamp's min/max is exercised)."""
    return amax_to_scale(x.abs().amax().float() / 2, dtype).reshape(())


def rows(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros(n, device="cuda"), torch.zeros(n, device="cuda", dtype=torch.int32)


@pytest.mark.parametrize("tile", TILES, ids=str)
@pytest.mark.parametrize("dtype", FORMATS, ids=str)
def test_gpu_weight_cast_and_transpose_kernels_store_every_tile_right(monkeypatch, tile, dtype):
    from cs336_basics.kernels import cast_triton, transpose_triton

    monkeypatch.setattr(cast_triton, "WEIGHT_CAST_TILE", tile)
    monkeypatch.setattr(transpose_triton, "TRANSPOSE_TILE", tile)
    gen = torch.Generator("cuda").manual_seed(0)
    for shape in ((300, 200), (896, 3584)):
        x = torch.randn(*shape, device="cuda", generator=gen).to(torch.bfloat16)
        scale = saturating_scale(x, dtype)
        tested = cast_triton.cast_transposed(x, scale, dtype, True, *rows(16))
        expected = cast_reference.cast_transposed(x, scale, dtype, True, *rows(16))
        assert_finite_fp8(*tested)
        assert_equal_bytes(tested, expected)
        transposed = transpose_triton.transpose(tested[0])
        assert_equal_bytes([transposed], [expected[1]])


@pytest.mark.parametrize("tile", TILES, ids=str)
@pytest.mark.parametrize("dtype", FORMATS, ids=str)
def test_gpu_swiglu_producers_store_every_tile_right(monkeypatch, tile, dtype):
    from cs336_basics.kernels import swiglu_triton

    monkeypatch.setattr(swiglu_triton, "SWIGLU_TILE", tile)
    monkeypatch.setattr(swiglu_triton, "SWIGLU_GRAD_TILE", tile)
    gen = torch.Generator("cuda").manual_seed(0)
    m, f = 300, 1024
    dg, h1, h3 = (torch.randn(m, f, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(3))
    scale = saturating_scale(swiglu_reference.swiglu(h1, h3), dtype).reshape(1)  # the op takes shape (1,)
    tested = swiglu_triton.swiglu_cast(h1, h3, scale, dtype, True, *rows(m), True)
    expected = swiglu_reference.swiglu_cast(h1, h3, scale, dtype, True, *rows(m), True)
    assert_finite_fp8(*tested)
    for test, ref in zip(tested, expected, strict=True):
        assert_same_bits(test, ref)  # one rounding of silu may differ in the last bit, never a NaN byte
    amax = swiglu_reference.swiglu_grad_amax(dg, h1, h3)
    scales = amax_to_scale(amax / 2, dtype)
    joint = scales / torch.tensor([1.0, 16.0], device="cuda")
    grad_args = (dg, h1, h3, scales, joint, dtype, True)
    tested = swiglu_triton.swiglu_grad_cast(*grad_args, *rows(m), *rows(m), True)
    expected = swiglu_reference.swiglu_grad_cast(*grad_args, *rows(m), *rows(m), True)
    assert_finite_fp8(*tested)
    for test, ref in zip(tested, expected, strict=True):
        assert_same_bits(test, ref)


@pytest.mark.parametrize("tile", TILES, ids=str)
@pytest.mark.parametrize("dtype", FORMATS, ids=str)
def test_gpu_rope_gradient_producer_stores_every_tile_right(monkeypatch, tile, dtype):
    from cs336_basics.kernels import rope_triton
    from cs336_basics.model.layers import RotaryEmbedding

    monkeypatch.setattr(rope_triton, "ROPE_GRAD_TILE", tile)
    batch, heads, seq, head_dim = 2, (4, 2, 2), 300, 64
    rope = RotaryEmbedding(head_dim, 512).cuda()
    gen = torch.Generator("cuda").manual_seed(0)
    # As attention hands them back: (batch, heads, seq, head_dim) views of token-major storage; k and v with fewer
    # heads (GQA), so that the launch's column tiles beyond their width are skipped at every tile size.
    grads = [torch.randn(batch, seq, n, head_dim, device="cuda", generator=gen).to(torch.bfloat16).transpose(1, 2)
             for n in heads]  # fmt: skip
    scales = torch.cat([
        amax_to_scale(rope_reference.rope_grad_amax(g, rope.cos, rope.sin, None, i < 2) / 2, dtype)
        for i, g in enumerate(grads)
    ])  # fmt: skip
    args = (*grads, rope.cos, rope.sin, None, scales, scales, dtype, True, [False] * 3, True)
    buffers = [b for _ in range(3) for b in rows(batch * seq)]
    tested = rope_triton.rope_grad_cast_qkv(*args, *buffers)
    expected = rope_reference.rope_grad_cast_qkv(*args, *[b.clone() for b in buffers])
    assert_finite_fp8(*tested)
    for test, ref in zip(tested, expected, strict=True):
        assert_same_bits(test, ref)


def _cast_with_amax_both_layouts(x: torch.Tensor, dtype: torch.dtype):
    """Dynamic tensorwise scaling as inductor compiles it for the backward GEMMs: the amax, the scale, the saturating
    cast (clamp: a min and a max), stored row-major and transposed, and the amax recorded by rows (delayed scaling's
    form): the pattern of pytorch/pytorch#188841."""
    limit = fp8_max(dtype)
    scale = (limit / torch.clamp(x.abs().amax().float(), min=1e-12)).float()
    y = (x.float() * scale).clamp(-limit, limit).to(dtype)
    return y, y.t().contiguous(), x.abs().amax(dim=-1)


@pytest.mark.parametrize("dtype", FORMATS, ids=str)
def test_gpu_inductor_compiled_cast_with_amax_into_a_transposed_output_is_right(dtype):
    compiled = torch.compile(_cast_with_amax_both_layouts, fullgraph=True, dynamic=False)
    gen = torch.Generator("cuda").manual_seed(0)
    for shape in ((16, 32), (300, 200), (2048, 896), (896, 3584), (8192, 896)):
        x = (torch.randn(*shape, device="cuda", generator=gen) * 3).to(torch.bfloat16)
        (y, y_t, rows), expected = compiled(x, dtype), _cast_with_amax_both_layouts(x, dtype)
        assert_finite_fp8(y, y_t)
        # The miscompile corrupts the transposed store only: it must hold the row-major store's bytes exactly.
        assert torch.equal(y_t.view(torch.uint8), y.view(torch.uint8).t())
        # Against eager, inductor's scale may round differently in the last bit, moving a rare value by one step.
        assert_same_bits(y, expected[0])
        assert torch.equal(rows, expected[2])
