"""The LoRA analysis's pure parts (the step's split, the predictions, the cast traffic) and the sweep's LoRA mode
(its plan, its commands and its refusals). CPU; the measurement itself runs on a GPU (benchmarks/results/)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from test_amdahl import cpu_op, kernel
from test_lora import FP8, tiny_lm
from tiny import tiny_model

from cs336_basics.config import FinetuneConfig
from cs336_basics.config_layers import build_config
from cs336_basics.diagnostics.amdahl.measure import breakdown_from_events, gpu_timeline
from cs336_basics.errors import ConfigError
from cs336_basics.lora import apply_lora
from cs336_basics.measure.results import append_runs
from cs336_basics.sweep import lora_analysis
from cs336_basics.sweep.cli import parse_options
from cs336_basics.sweep.lora import lora_command, lora_points, run_lora_sweep
from cs336_basics.sweep.lora_analysis import (
    CAST_BYTES,
    base_gemm_prediction,
    cast_bytes_per_token,
    format_lora_table,
    simple_prediction,
    split_fp8_step_by_kernel_name,
    split_step,
)


def test_the_predictions_are_the_formulas_of_the_docstring():
    assert simple_prediction(0.0) == pytest.approx(1.5) and simple_prediction(1.0) == pytest.approx(1.0)
    assert simple_prediction(0.1) == pytest.approx(1 / (0.9 / 1.5 + 0.1))
    assert base_gemm_prediction(0.6, 2.0) == pytest.approx(1 / (0.4 + 0.3))
    assert base_gemm_prediction(0.0, 2.0) == 1.0


def test_the_step_splits_gemms_by_whether_a_dimension_is_an_adapter_width():
    events = [
        cpu_op("aten::mm", [(4096, 256), (256, 16)], [("gemm_a", 10.0)]),  # x A^T: adapter
        cpu_op("aten::mm", [(4096, 16), (16, 256)], [("gemm_b", 20.0)]),  # (x A^T) B^T: adapter
        cpu_op("aten::mm", [(4096, 256), (256, 48)], [("gemm_qkv_a", 15.0)]),  # x [A_q; A_k; A_v]^T: adapters
        cpu_op("aten::_scaled_mm", [(4096, 256), (256, 768)], [("nvjet_qqtst", 300.0)]),  # base, converted
        cpu_op("aten::mm", [(4096, 256), (256, 512)], [("gemm_head", 100.0)]),  # base, not converted (the head)
        cpu_op("aten::add", [(4096, 256)], [("add_kernel", 50.0)]),  # not a GEMM
        kernel("gemm_a", 10.0),
    ]
    converted = {(256, 768, 4096)}
    split = split_step(events, adapter_widths={16, 48}, converted=converted)
    assert split == pytest.approx({"adapter_gemm_ms": 0.045, "base_gemm_ms": 0.4, "base_converted_gemm_ms": 0.3})


def test_under_cuda_graphs_an_all_fp8_base_splits_its_gemms_by_kernel_name():
    # Replayed kernels are linked to no op: the split by shape finds nothing, the kernels' names tell FP8 from BF16.
    events = [
        kernel("nvjet_sm90_qqtst_128x128_TNT", 300.0),  # a base GEMM, forward (E4M3 x E4M3)
        kernel("nvjet_sm90_qrtst_128x128_TNN", 200.0),  # a base GEMM, input gradient (E4M3 x E5M2)
        kernel("nvjet_sm90_tst_64x8_NNT", 30.0),  # an adapter GEMM, in BF16
        kernel("cudnn_sdpa_flash_fprop", 90.0),  # attention: no linear GEMM
        kernel("triton_poi_fused_add_0", 50.0),
    ]
    assert not any(split_step(events, adapter_widths={16}, converted={(256, 768, 4096)}).values())
    split = split_fp8_step_by_kernel_name(breakdown_from_events(events))
    assert split == pytest.approx({"adapter_gemm_ms": 0.03, "base_gemm_ms": 0.5, "base_converted_gemm_ms": 0.5})


@pytest.mark.parametrize("fp8_lm_head", [True, False])
def test_the_split_by_kernel_name_is_taken_only_where_every_linear_runs_in_fp8(fp8_lm_head):
    # A BF16 head's GEMMs would otherwise count as the adapters'.
    config = build_config({"preset": "1.3b", "fp8": {"use_fp8": True, "fp8_lm_head": fp8_lm_head}})
    assert lora_analysis._every_linear_converted(config) is fp8_lm_head


@pytest.mark.parametrize("scaling", ["dynamic", "delayed"])
def test_cast_traffic_counts_each_shared_input_once_and_the_fused_producers_extra(scaling):
    cfg = tiny_model()
    dim, ffn, vocab, layers = cfg.dim, cfg.intermediate_size, cfg.vocab_size, cfg.n_layers

    def traffic(**fp8):
        model = tiny_lm(dtype=torch.bfloat16)
        config = dataclasses.replace(FP8, fp8_path="fused", fp8_lm_head=True, fp8_scaling=scaling, **fp8)
        apply_lora(model, FinetuneConfig(init_from="x", lora_rank=4, lora_targets="attn"), config)
        return cast_bytes_per_token(model)

    cast = CAST_BYTES[scaling]
    # Unshared: every FP8 linear casts its input and its output gradient; the fused head writes its gradient in FP8.
    per_block = cast * (4 * (dim + dim) + 2 * (dim + ffn) + (ffn + dim))  # q, k, v, o; w1, w3; w2
    head = cast * dim - vocab
    assert traffic(fp8_share_input_casts=False, fp8_fused_swiglu=False) == layers * per_block + head
    shared = per_block - cast * (2 * dim + dim)  # q/k/v's input once, w1/w3's once
    assert traffic(fp8_fused_swiglu=False, fp8_fused_rope=False) == layers * shared + head
    swiglu = 2 * cast * dim + sum(lora_analysis.SWIGLU_EXTRA[scaling]) * ffn
    attention = cast * (dim + 3 * dim) + cast * (dim + dim)
    assert traffic(fp8_fused_rope=False) == layers * (attention + swiglu) + head
    # q/k/v + RoPE as one unit: their input cast once, each gradient written by the unit's producer (all have adapters)
    with_rope = cast * dim + 3 * lora_analysis.ROPE_GRAD_EXTRA[scaling][0] * dim + cast * (dim + dim)
    assert traffic() == layers * (with_rope + swiglu) + head


def test_the_table_shows_measured_speedup_and_predictions_and_marks_what_was_not_split():
    common = dict(preset="1.3b", batch_size=4, lora_rank=16, lora_targets="attn", peak_mem_gib=12.0)
    split = dict(adapter_gemm_ms=7.0, base_gemm_ms=50.0, rest_ms=30.0, cast_ms=0.0)
    bf16 = dict(common, precision="bf16", tokens_per_sec=1000.0, speedup_vs_bf16=1.0, **split)
    fp8 = dict(common, precision="fp8-tensorwise", tokens_per_sec=1250.0, speedup_vs_bf16=1.25, **split)
    fp8.update(predicted_speedup_simple=1.44, predicted_speedup_base_gemms=1.33, predicted_speedup_ours=1.26)
    fp8.update(cast_ms=5.0, predicted_cast_ms=5.5)
    table = format_lora_table([bf16, fp8])
    assert "| 1.3b | 4 | 16 | attn | 1,000 | 1,250 | 1.250x | 1.44x | 1.33x | 1.260x | 7.0 / 7.0 |" in table
    unsplit = {k: None for k in lora_analysis.SPLIT_FIELDS}
    table = format_lora_table([{**bf16, **unsplit}, {**fp8, **unsplit, "predicted_speedup_ours": None}])
    assert "| 1.250x | 1.44x | 1.33x | n/a | n/a / n/a |" in table


def test_the_sweep_lora_mode_plans_every_rank_and_target_and_refuses_what_it_cannot_measure(tmp_path):
    options = parse_options(["--presets", "366m", "--batch_sizes", "4,8", "--lora_ranks", "8,16"])
    options = dataclasses.replace(options, lora_targets=("attn", "q,v"))
    points = lora_points(options)
    assert points[0] == ("366m", 4, 8, "attn") and len(points) == 2 * 2 * 2
    command = lora_command(options, points[-1], tmp_path / "c.json", tmp_path / "lora.json")
    assert command[command.index("--lora_targets") + 1] == "q,v" and "--random_base" in command
    assert '"batch_size": 8' in (tmp_path / "c.json").read_text()
    assert '"compile_mode": "auto"' in (tmp_path / "c.json").read_text()  # the trainer's default, as a user runs it
    assert parse_options(["--lora_ranks", "16", "--lora_targets", "attn,q+v"]).lora_targets == ("attn", "q,v")
    delayed = parse_options(["--lora_ranks", "16", "--fp8_path", "fused", "--fp8_scaling", "delayed"])
    lora_command(delayed, lora_points(delayed)[0], tmp_path / "d.json", tmp_path / "lora.json")
    assert json.loads((tmp_path / "d.json").read_text())["fp8"]["fp8_scaling"] == "delayed"
    with pytest.raises(ConfigError, match="--fp8_scaling is set per configuration"):
        parse_options(["--fp8_scaling", "delayed"])  # a precision sweep sets it per point
    for argv, match in (
        (["--lora_ranks", "16", "--precisions", "bf16"], "drop"),
        (["--lora_ranks", "16", "--compile", "default,max-autotune"], "one --compile value"),
        (["--lora_ranks", "0"], "positive integers"),
        (["--lora_targets", "attn"], "add --lora_ranks"),
        (["--lora_ranks", "16", "--lora_targets", "qkv"], "not a layer"),
    ):
        with pytest.raises(ConfigError, match=match):
            parse_options(argv)


def test_the_sweep_logs_and_tables_points_that_were_not_split(tmp_path):
    """Under CUDA graphs the analysis records speeds without split or predictions: the sweep logs them as n/a and goes
    on to the next point."""
    options = parse_options(["--presets", "1.3b", "--batch_sizes", "4,8", "--lora_ranks", "16"])
    unsplit = {k: None for k in lora_analysis.SPLIT_FIELDS}
    shape = {"preset": "1.3b", "lora_rank": 16, "lora_targets": "attn", "peak_mem_gib": 12.0}

    def run_logged(command, log_path, timeout_s):  # stands in for the analysis process: appends its two records
        batch = json.loads(Path(command[command.index("--config") + 1]).read_text())["train"]["batch_size"]
        records = [
            {**shape, **unsplit, "batch_size": batch, "precision": p, "tokens_per_sec": t, "speedup_vs_bf16": t / 100}
            for p, t in (("bf16", 100.0), ("fp8-tensorwise", 124.0))
        ]
        append_runs(command[command.index("--json") + 1], records)
        return 0, False

    lines = []
    records = run_lora_sweep(options, tmp_path, run_logged, log=lines.append)
    assert len(records) == 4 and sum("1.240x over BF16 base" in line for line in lines) == 2
    assert any("predicted: simple n/a, base GEMMs n/a, ours n/a" in line for line in lines)
    assert "| 1.3b | 8 | 16 | attn | 100 | 124 | 1.240x | n/a |" in (tmp_path / "lora.md").read_text()
    assert (tmp_path / "lora.png").read_bytes().startswith(b"\x89PNG")


def test_the_gpu_timeline_merges_overlapping_kernels_and_ranks_the_gaps():
    events = [kernel("a", 100), kernel("b", 100, start=50), kernel("c", 100, start=400), kernel("d", 100, start=1500)]
    timeline = gpu_timeline([*events, cpu_op("aten::mm", [], [])])
    assert timeline.busy_ms == pytest.approx(0.35)  # 0-150, 400-500, 1500-1600 (us)
    assert timeline.gaps == [(1.0, "c", "d"), (0.25, "b", "c")]
    assert timeline.idle_ms(2.0) == pytest.approx(1.65) and timeline.idle_ms(0.1) == 0.0


def test_the_analysis_refuses_without_a_gpu_or_without_lora():
    from cs336_basics.config import RunConfig

    with pytest.raises(ConfigError, match="LoRA configuration"):
        lora_analysis.analyse_lora(RunConfig())
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="CUDA GPU"):
            lora_analysis.analyse_lora(RunConfig(finetune=FinetuneConfig(init_from="x", lora_rank=4)))
