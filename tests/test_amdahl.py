"""Where the time goes: the Amdahl math, GEMM enumeration, profile classification and table (CPU); the GEMM
microbenchmark and the end-to-end analysis on a tiny model (GPU)."""

import dataclasses
import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from tiny import tiny_model
from torch.autograd import DeviceType

from cs336_basics.config import FP8Config, RunConfig, TrainConfig
from cs336_basics.config_layers import build_config
from cs336_basics.diagnostics.amdahl import (
    AmdahlRow,
    GemmShape,
    MatmulTimings,
    amdahl_prediction,
    analyse,
    breakdown_from_events,
    cast_overhead_ms,
    format_shape_table,
    format_table,
    format_top_kernels,
    linear_gemm_shapes,
    matmul_speedup,
    predicted_step_ms,
    time_matmuls,
)
from cs336_basics.diagnostics.amdahl import __main__ as amdahl_main
from cs336_basics.errors import ConfigError

# 2 layers x (q, k, v, output_proj, w1, w2, w3) + lm_head = 15 linears
TINY = tiny_model(dim=64, intermediate_size=128, vocab_size=256, context_length=32)
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")


# ---- the math ----


def test_amdahl_known_values():
    assert amdahl_prediction(0.0, 3.0) == 1.0
    assert amdahl_prediction(1.0, 1.7) == pytest.approx(1.7)
    assert amdahl_prediction(0.5, 2.0) == pytest.approx(4 / 3)
    assert amdahl_prediction(0.3, 1.0) == 1.0


@pytest.mark.parametrize(("x", "s"), [(-0.1, 2.0), (1.5, 2.0), (0.5, 0.0), (0.5, -1.0), (math.nan, 2.0)])
def test_amdahl_rejects_impossible_inputs(x, s):
    with pytest.raises(ValueError):
        amdahl_prediction(x, s)


def test_cast_overhead_is_measured_minus_predicted():
    # 100 ms BF16 step, half of it in GEMMs that get 2x faster: 75 ms predicted.
    assert predicted_step_ms(100.0, 0.5, 2.0) == pytest.approx(75.0)
    assert cast_overhead_ms(100.0, 80.0, 0.5, 2.0) == pytest.approx(5.0)
    assert cast_overhead_ms(100.0, 70.0, 0.5, 2.0) == pytest.approx(-5.0)
    assert cast_overhead_ms(40.0, 40.0, 0.0, 5.0) == pytest.approx(0.0)


# ---- GEMM shapes ----


def by_layer(shapes):
    out = {}
    for s in shapes:
        for fqn in s.layers:
            out.setdefault(fqn, {})[s.kind] = s
    return out


def test_three_gemms_per_linear_with_tokens_as_m():
    shapes = linear_gemm_shapes(TINY, batch_size=4, fp8_filter=FP8Config())
    m = 4 * 32
    assert sum(s.count for s in shapes) == 3 * 15
    layers = by_layer(shapes)
    assert len(layers) == 15 and "lm_head" in layers
    head = layers["lm_head"]
    assert (head["forward"].m, head["forward"].k, head["forward"].n) == (m, 64, 256)
    assert (head["grad_input"].m, head["grad_input"].k, head["grad_input"].n) == (m, 256, 64)
    assert (head["grad_weight"].m, head["grad_weight"].k, head["grad_weight"].n) == (256, m, 64)
    w2 = layers["layers.1.ffn.w2"]["forward"]
    assert (w2.m, w2.k, w2.n, w2.flops) == (m, 128, 64, 2 * m * 128 * 64)
    # default filter: everything but the lm_head
    assert not any(s.converted for s in head.values())
    assert all(s.converted for fqn, kinds in layers.items() if fqn != "lm_head" for s in kinds.values())


def test_identical_gemms_are_merged_with_counts():
    shapes = linear_gemm_shapes(TINY, batch_size=4, fp8_filter=FP8Config())
    assert len({s.key for s in shapes}) == len(shapes)
    # q, k, v and output_proj are all 64 -> 64: one forward entry for 2 layers x 4
    attn_fwd = next(s for s in shapes if s.label() == "forward 128x64 @ 64x64")
    assert attn_fwd.count == 8 and len(attn_fwd.layers) == 8
    assert {f.rsplit(".", 1)[-1] for f in attn_fwd.layers} == {"q_proj", "k_proj", "v_proj", "output_proj"}


def test_converted_flags_follow_the_shape_filter_and_lm_head_flag():
    # tensorwise pays if in_features > 4096 or out_features > 1024: only w1/w3 (64 -> 1040) pass.
    model = dataclasses.replace(TINY, intermediate_size=1040, vocab_size=2048)
    layers = by_layer(linear_gemm_shapes(model, 2, FP8Config(fp8_shape_filter=True)))
    converted = {fqn for fqn, kinds in layers.items() if all(s.converted for s in kinds.values())}
    assert converted == {f"layers.{i}.ffn.{w}" for i in range(2) for w in ("w1", "w3")}
    # lm_head (64 -> 2048) passes the shape rule but needs --fp8_lm_head
    layers = by_layer(linear_gemm_shapes(model, 2, FP8Config(fp8_shape_filter=True, fp8_lm_head=True)))
    assert all(s.converted for s in layers["lm_head"].values())
    assert not any(s.converted for s in layers["layers.0.ffn.w2"].values())


def test_dims_not_divisible_by_16_are_never_converted():
    model = dataclasses.replace(TINY, n_layers=1, vocab_size=1000)
    layers = by_layer(linear_gemm_shapes(model, 2, FP8Config(fp8_lm_head=True)))
    assert not any(s.converted for s in layers["lm_head"].values())
    assert all(s.converted for s in layers["layers.0.attn.q_proj"].values())


def test_rowwise_with_gw_hp_keeps_grad_weight_in_bf16():
    layers = by_layer(linear_gemm_shapes(TINY, 4, FP8Config(fp8_recipe="rowwise_with_gw_hp")))
    q = layers["layers.0.attn.q_proj"]
    assert q["forward"].converted and q["grad_input"].converted and not q["grad_weight"].converted


def test_gradient_checkpointing_recomputes_block_forwards_only():
    model = dataclasses.replace(TINY, gradient_checkpointing=True)
    layers = by_layer(linear_gemm_shapes(model, 4, FP8Config()))
    w2 = next(
        s for s in linear_gemm_shapes(model, 4, FP8Config()) if "layers.0.ffn.w2" in s.layers and s.kind == "forward"
    )
    assert w2.count == 2 * 2  # two layers, each forward run twice
    assert layers["lm_head"]["forward"].count == 1


def test_a_callable_filter_is_accepted():
    shapes = linear_gemm_shapes(TINY, 1, lambda module, fqn: fqn.endswith("w1"))
    converted = {fqn for s in shapes if s.converted for fqn in s.layers}
    assert converted == {"layers.0.ffn.w1", "layers.1.ffn.w1"}


# ---- the aggregate s ----


def test_matmul_speedup_weights_by_count_over_converted_only():
    a = GemmShape("forward", 128, 64, 64, converted=True, count=3)
    b = GemmShape("grad_input", 128, 64, 64, converted=True, count=1)
    c = GemmShape("forward", 128, 64, 256, converted=False, count=1)
    times = {a: (1.0, 0.5), b: (2.0, 0.5), c: (100.0, 1.0)}
    assert matmul_speedup(times) == pytest.approx((3 * 1.0 + 2.0) / (3 * 0.5 + 0.5))
    timings = MatmulTimings("tensorwise", times)
    assert timings.speedup == pytest.approx(2.5) and timings[c] == (100.0, 1.0) and len(timings) == 3
    assert math.isnan(matmul_speedup({c: (1.0, 0.5)}))
    rows = timings.rows()
    assert rows[0]["speedup"] == pytest.approx(2.0)
    assert "| forward | 128x64 @ 64x64 | 3 | yes |" in format_shape_table(rows)


# ---- classifying a profile ----


def cpu_op(name, shapes=(), kernels=()):
    kernels = [SimpleNamespace(name=k, device=0, duration=us) for k, us in kernels]
    return SimpleNamespace(
        name=name, input_shapes=[list(s) for s in shapes], kernels=kernels, device_type=DeviceType.CPU
    )


def kernel(name, us, is_user_annotation=False, start=0.0):
    return SimpleNamespace(
        name=name,
        device_type=DeviceType.CUDA,
        kernels=[],
        time_range=SimpleNamespace(start=float(start), end=float(start + us)),
        is_user_annotation=is_user_annotation,
    )


def toy_shapes():
    # w1: 64 -> 128 converted; w2: 128 -> 64 not converted. w1's forward (M x 64 @ 64 x 128) and w2's grad_input
    # (M x 64 @ 64 x 128) are the same GEMM problem, so BF16 time on it is split by count (1 of 2 converted).
    return [
        GemmShape("forward", 128, 64, 128, True, 1, ("w1",)),
        GemmShape("grad_input", 128, 128, 64, True, 1, ("w1",)),
        GemmShape("grad_weight", 128, 128, 64, True, 1, ("w1",)),
        GemmShape("forward", 128, 128, 64, False, 1, ("w2",)),
        GemmShape("grad_input", 128, 64, 128, False, 1, ("w2",)),
        GemmShape("grad_weight", 64, 128, 128, False, 1, ("w2",)),
    ]


def test_bf16_profile_attributes_gemms_by_op_and_shape():
    events = [
        cpu_op("aten::mm", [(128, 64), (64, 128)], [("nvjet_tst_a", 100.0)]),  # w1 fwd or w2 grad_input
        cpu_op("aten::mm", [(128, 64), (64, 128)], [("nvjet_tst_a", 100.0)]),
        cpu_op("aten::mm", [(128, 128), (128, 64), (128, 64)], [("nvjet_tst_b", 60.0)]),  # out= variant
        cpu_op("aten::mm", [(64, 128), (128, 128)], [("nvjet_tst_c", 40.0)]),  # w2 grad_weight: unconverted
        cpu_op("aten::mm", [(7, 9), (9, 11)], [("gemm_small", 5.0)]),  # matches no linear
        cpu_op("aten::_scaled_dot_product_flash_attention", [], [("flash_fwd_kernel", 30.0)]),
        kernel("nvjet_tst_a", 100.0),
        kernel("nvjet_tst_a", 100.0),
        kernel("nvjet_tst_b", 60.0),
        kernel("nvjet_tst_c", 40.0),
        kernel("gemm_small", 5.0),
        kernel("flash_fwd_kernel", 30.0),
        kernel("triton_poi_fused_add", 65.0),
        # inductor's GPU-side annotation around a compiled graph: spans kernels, is not one
        kernel("## Call CompiledFxGraph abc ##", 390.0, is_user_annotation=True),
    ]
    b = breakdown_from_events(events, toy_shapes(), steps=1, step_ms_samples=[0.5, 0.6, 0.45])
    assert (b.method, b.attribution) == ("cpu-op", "shape")
    assert b.step_ms == pytest.approx(0.5)
    assert b.kernel_ms == pytest.approx(0.4)
    assert b.linear_gemm_ms == pytest.approx(0.305)
    # problem (k=64, 128, 128): w1 forward (converted) and w2 grad_input (not): 200 us split 1:1.
    # problem (k=128, 64, 128): w1 grad_input, w1 grad_weight (converted), w2 forward, w2 grad_weight (not): 2 of 4.
    assert b.converted_gemm_ms == pytest.approx((200.0 / 2 + (60.0 + 40.0) / 2) / 1e3)
    assert b.unmatched_gemm_ms == pytest.approx(0.005)
    assert b.attention_ms == pytest.approx(0.03)
    assert b.fp8_gemm_ms == 0 and b.n_scaled_mm_calls == 0 and b.n_linear_gemm_calls == 5
    assert b.converted_share == pytest.approx(0.15 / 0.5)
    assert b.top_kernels[0] == ("nvjet_tst_a", pytest.approx(0.2), 2)  # two launches of 100 us
    top_two = breakdown_from_events(events, toy_shapes(), top_kernels=2).top_kernels
    assert [name for name, _, _ in top_two] == ["nvjet_tst_a", "triton_poi_fused_add"]
    assert "| `triton_poi_fused_add` | 0.065 | 1 |" in format_top_kernels("FP8", top_two)
    assert b.to_dict()["non_gemm_kernel_ms"] == pytest.approx(0.4 - 0.305)


def test_fp8_profile_counts_scaled_mm_as_the_converted_gemms():
    events = [
        cpu_op("aten::_scaled_mm", [(128, 64), (64, 128), (), ()], [("nvjet_qqtst_x", 50.0)]),
        cpu_op("aten::_scaled_mm", [(128, 128), (128, 64), (), ()], [("nvjet_qqtst_y", 30.0)]),
        cpu_op("aten::mm", [(128, 128), (128, 64)], [("nvjet_tst_b", 60.0)]),
        kernel("nvjet_qqtst_x", 50.0),
        kernel("nvjet_qqtst_y", 30.0),
        kernel("nvjet_tst_b", 60.0),
        kernel("triton_red_fused_amax", 20.0),
    ]
    b = breakdown_from_events(events, toy_shapes(), steps=2, step_ms_samples=[1.0])
    assert (b.method, b.attribution) == ("cpu-op", "fp8-ops")
    assert b.converted_gemm_ms == pytest.approx(0.04) and b.fp8_gemm_ms == pytest.approx(0.04)
    assert b.linear_gemm_ms == pytest.approx(0.07) and b.kernel_ms == pytest.approx(0.08)
    assert b.n_scaled_mm_calls == 1 and b.n_linear_gemm_calls == 1  # per step, 2 steps profiled


def test_falls_back_to_kernel_names_without_cpu_attribution():
    events = [
        cpu_op("aten::mm", [(128, 64), (64, 128)]),  # no kernels linked
        kernel("sm90_xmma_gemm_bf16bf16_bf16f32", 80.0),
        kernel("fmha_cutlassF_bf16_aligned", 40.0),  # attention, although "cutlass" is in its name
        kernel("triton_poi_fused_mul", 80.0),
    ]
    b = breakdown_from_events(events, toy_shapes(), steps=1, step_ms_samples=[0.25])
    assert (b.method, b.attribution) == ("kernel-name", "flops")
    assert b.linear_gemm_ms == pytest.approx(0.08) and b.attention_ms == pytest.approx(0.04)
    # converted share of linear FLOPs is 3 of 6 equal-FLOP GEMMs
    assert b.converted_gemm_ms == pytest.approx(0.04)


def test_kernel_name_fallback_recognises_fp8_gemms():
    # kernel names from a real H200 profile (benchmarks/results/2026-11-21-verify-366m-h200.json)
    events = [
        kernel("nvjet_sm90_qqtst_256x128_128x4_1x2_h_bz_coopA_TNT", 30.0),
        kernel("nvjet_sm90_qrtst_112x128_128x7_2x1_v_bz_coopA_algo2_TNN", 20.0),
        kernel("nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_TNT", 50.0),
    ]
    b = breakdown_from_events(events, toy_shapes(), steps=1, step_ms_samples=[0.2])
    assert (b.method, b.attribution, b.n_scaled_mm_calls) == ("kernel-name", "fp8-ops", 2)
    assert b.fp8_gemm_ms == pytest.approx(0.05) and b.linear_gemm_ms == pytest.approx(0.1)


# ---- table and row ----


def row(**overrides):
    values = dict(
        preset="366m",
        batch_size=8,
        linear_share=0.3,
        matmul_speedup=1.7,
        predicted_speedup=amdahl_prediction(0.3, 1.7),
        measured_speedup=1.048,
        predicted_fp8_step_ms=predicted_step_ms(88.0, 0.3, 1.7),
        measured_fp8_step_ms=84.0,
        cast_overhead_ms=cast_overhead_ms(88.0, 84.0, 0.3, 1.7),
        n_converted=48,
        n_linear=169,
        bf16_step_ms=88.0,
    )
    return AmdahlRow(**{**values, **overrides})


def test_format_table_and_json_ready_dict():
    table = format_table([row(), row(batch_size=16, in_situ_matmul_speedup=math.nan, cast_overhead_ms=math.nan)])
    lines = table.splitlines()
    assert len(lines) == 4
    assert lines[0].count("|") == lines[1].count("|") == lines[2].count("|")
    assert f"| 366m | 8 | 48/169 | 30.0% | 1.70x | {amdahl_prediction(0.3, 1.7):.3f}x | 1.048x | 88.00 |" in lines[2]
    assert lines[2].rstrip(" |").endswith(f"{cast_overhead_ms(88.0, 84.0, 0.3, 1.7):+.2f}")
    assert "n/a" in lines[3]
    d = row(cast_overhead_ms=math.nan).to_dict()
    assert d["cast_overhead_ms"] is None and d["in_situ_matmul_speedup"] is None
    json.dumps(d, allow_nan=False)


# ---- refusals on CPU ----


@no_cuda
def test_analyse_needs_a_gpu():
    config = build_config({"preset": "cpu-small"})
    with pytest.raises(ConfigError, match="needs a CUDA GPU"):
        analyse(config)
    with pytest.raises(ConfigError, match="needs a CUDA GPU"):
        analyse(config, device="cpu")


@no_cuda
def test_time_matmuls_needs_a_gpu():
    with pytest.raises(ConfigError, match="needs a CUDA GPU"):
        time_matmuls([GemmShape("forward", 128, 64, 64, True)])


@no_cuda
def test_cli_reports_the_refusal(capsys):
    assert amdahl_main.main(["--preset", "cpu-small"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


# ---- GPU ----


@pytest.mark.gpu
def test_time_matmuls_on_the_gpu():
    big = GemmShape("forward", 8192, 8192, 8192, True)
    small = GemmShape("grad_weight", 256, 512, 256, True, count=2)
    timings = time_matmuls([big, small], "cuda")
    assert set(timings) == {big, small}
    for bf16, fp8 in timings.values():
        assert bf16 > 0 and fp8 > 0
    bf16, fp8 = timings[big]
    assert bf16 / fp8 > 1.0, timings.rows()
    assert timings.speedup == pytest.approx((bf16 + 2 * timings[small][0]) / (fp8 + 2 * timings[small][1]))
    rowwise = time_matmuls([big], "cuda", recipe="rowwise")
    assert rowwise[big][1] > 0


@pytest.mark.gpu
def test_analyse_a_tiny_model_end_to_end():
    config = RunConfig(
        preset="tiny",
        model=tiny_model(dim=64, intermediate_size=128, vocab_size=128, context_length=32),
        # compile default: under CUDA graphs (auto's choice for FP8) the profiler links no kernel to its CPU op.
        train=TrainConfig(batch_size=4, compile_mode="default"),
        fp8=FP8Config(fp8_shape_filter=False, fp8_lm_head=False),
    )
    tokens = np.random.default_rng(0).integers(0, 128, size=20000, dtype=np.uint16)
    result = analyse(config, "cuda", steps=4, data=(tokens[:18000], tokens[18000:]))
    assert result.n_converted == 14 and result.n_linear == 15  # the lm_head stays BF16
    assert 0 < result.linear_share < 1
    assert 0 < result.all_linear_share < 1
    for name in (
        "matmul_speedup",
        "predicted_speedup",
        "measured_speedup",
        "predicted_fp8_step_ms",
        "measured_fp8_step_ms",
        "cast_overhead_ms",
        "bf16_step_ms",
    ):
        assert math.isfinite(getattr(result, name)), name
    # Three GEMMs per FP8 linear, less the input gradients the default fused path runs as one GEMM: q/k/v's (two
    # fewer per layer) and w1/w3's (one).
    assert result.fp8_breakdown["n_scaled_mm_calls"] >= 3 * 14 - 2 * (2 + 1)
    assert result.bf16_breakdown["n_scaled_mm_calls"] == 0
    assert result.attribution == "shape" and result.method == "cpu-op"
    for breakdown in (result.bf16_breakdown, result.fp8_breakdown):  # annotations are not kernels
        assert not any(name.startswith("## ") for name, *_ in breakdown["top_kernels"])
    json.dumps(result.to_dict(), allow_nan=False)
    assert "tiny" in format_table([result])


def test_step_counts_below_one_are_refused_by_the_analyses(capsys):
    from cs336_basics.diagnostics.amdahl.__main__ import main as amdahl_main
    from cs336_basics.sweep import lora_analysis

    for main in (amdahl_main, lora_analysis.main):
        with pytest.raises(SystemExit) as stop:
            main(["--timing_steps", "0"])
        assert stop.value.code == 2 and "must be a whole number of at least 1, got '0'" in capsys.readouterr().err
