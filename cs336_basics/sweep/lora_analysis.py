"""Where a LoRA fine-tuning step's time goes on a BF16 base and on an FP8 base, and three predictions of the FP8
base's speedup set beside the measured one.

    python -m cs336_basics.sweep.lora_analysis --preset 1.3b --init_from BASE.pt --lora_rank 16 \\
        --lora_targets attn --json out.json

Both bases are built from the same weights and trained in this process (compiled, `--steps` steps: tokens/s, MFU,
peak memory, compile time and loss, as every sweep row), then one more step of each is profiled and split into:

  adapter GEMMs  the LoRA matrices' GEMMs (one of their dimensions is the rank)
  base GEMMs     the frozen linears' GEMMs: forward and input gradient (a frozen weight has no weight gradient)
  casts          FP8's extra non-GEMM kernel time over the BF16 base's (amax passes, casts; FP8 profile only)
  rest           the step's wall time minus those: attention, norms, RoPE, the loss, the optimizer, and the GPU's
                 idle time (reported on its own too: the step's wall time minus its kernels' busy time)

GEMMs are told apart by their shapes, which the profiler records on the op that launched each kernel. Under CUDA
graphs (an FP8 base's default) kernels are replayed apart from their ops; an FP8 base whose every linear is FP8 is then
split by kernel name (its FP8 GEMMs are the base's, its BF16 GEMMs the adapters'), and the record says which
(`split_method`).

The predictions of the FP8 base's speedup, each from the BF16 base's profile and measurements made apart from the
FP8 step:

  simple      the users' rule of thumb, 1 / ((1 - X) / 1.5 + X), X the adapter GEMMs' share of the step
  base GEMMs  Amdahl's law over the base's two GEMMs per linear, with their weights cached in FP8 (no weight casts):
              1 / ((1 - Xb) + Xb / s), Xb the share of the converted base GEMMs, s their FP8 speedup timed alone
  ours        the base-GEMMs prediction plus the casts FP8 still needs each step (inputs and output gradients, at
              their sizes), priced as memory traffic at this GPU's measured copy bandwidth
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from cs336_basics.config import RunConfig
from cs336_basics.devices import require_cuda
from cs336_basics.diagnostics.amdahl.law import GemmShape, linear_gemm_shapes
from cs336_basics.diagnostics.amdahl.measure import (
    StepBreakdown,
    breakdown_from_events,
    gpu_timeline,
    linear_gemm_calls,
    measurement_plan,
    measurement_tokens,
    profiled_steps,
    time_matmuls,
)
from cs336_basics.errors import ConfigError
from cs336_basics.measure.results import format_or_na, run_record
from cs336_basics.measure.timing import time_calls_ms

if TYPE_CHECKING:
    from cs336_basics.build import Plan

RULE_OF_THUMB_SPEEDUP = 1.5  # what the users' formula assumes the non-adapter compute gains from FP8
# Bytes moved per element by one cast of a BF16 tensor, per scaling: dynamic reads it for the amax (2), again to cast
# (2) and writes FP8 (1); delayed casts in one pass that also records the amax (2 + 1).
CAST_BYTES = {"dynamic": 5, "delayed": 3}
# The fused SwiGLU producers' extra bytes per element of the activation over the BF16 SwiGLU, (forward, backward).
# Forward: BF16 reads h1 and h3 (4) and writes g (2); dynamic reads them twice (amax pass, cast pass; 8) and writes FP8
# (1): +3; delayed reads them once: -1. Backward: BF16 reads dg, h1, h3 (6) and writes two gradients (4); dynamic reads
# them twice (12) and writes two FP8 gradients (2): +4; delayed reads them once: -2.
SWIGLU_EXTRA = {"dynamic": (3, 4), "delayed": (-1, -2)}
# The q/k/v + RoPE unit's extra bytes per element of an output gradient over BF16's RoPE backward (which reads the
# gradient, 2, and writes it rotated, 2), (with adapters, which also read the BF16 gradient; without). Delayed reads it
# once and writes FP8 (1) and, for adapters, BF16 (2): +1 / -1; dynamic also reads it for the amax (2): +3 / +1.
ROPE_GRAD_EXTRA = {"dynamic": (3, 1), "delayed": (1, -1)}

SPLIT_FIELDS = (
    "adapter_gemm_ms", "base_gemm_ms", "base_converted_gemm_ms", "non_gemm_kernel_ms", "attention_ms", "cast_ms",
    "rest_ms",
)  # fmt: skip


def simple_prediction(adapter_share: float) -> float:
    return 1.0 / ((1.0 - adapter_share) / RULE_OF_THUMB_SPEEDUP + adapter_share)


def base_gemm_prediction(base_share: float, gemm_speedup: float) -> float:
    return 1.0 / ((1.0 - base_share) + base_share / gemm_speedup)


def cast_bytes_per_token(model: torch.nn.Module) -> int:
    """Bytes per token the FP8 base's casts move each training step (lora/layers.py's modules; see CAST_BYTES)."""
    from cs336_basics.lora.apply import frozen_fp8_linears
    from cs336_basics.lora.layers import FrozenFp8LMHead, FrozenFp8QkvRope, FrozenFp8SwiGLU, FrozenSharedInput

    fp8_layers = frozen_fp8_linears(model)
    scaling = "delayed" if fp8_layers and fp8_layers[0].scaling.delayed else "dynamic"
    cast = CAST_BYTES[scaling]
    total, grouped = 0, set()
    for module in model.modules():
        if isinstance(module, FrozenFp8SwiGLU):
            dim, ffn = module.w1.in_features, module.w1.out_features
            total += 2 * cast * dim + sum(SWIGLU_EXTRA[scaling]) * ffn
            grouped |= {id(module.w1), id(module.w2), id(module.w3)}
        elif isinstance(module, FrozenFp8QkvRope):
            with_adapters, without = ROPE_GRAD_EXTRA[scaling]
            grads = sum((with_adapters if m.rank else without) * m.out_features for m in module.linears)
            total += cast * module.linears[0].in_features + grads
            grouped |= {id(m) for m in module.linears}
        elif isinstance(module, FrozenSharedInput) and module.fp8:
            total += cast * (module.linears[0].in_features + sum(m.out_features for m in module.linears))
            grouped |= {id(m) for m in module.linears}
    for module in fp8_layers:
        if id(module) not in grouped:
            # The fused head writes the logits' gradient in FP8 (1 byte) instead of BF16 (2), with no amax pass.
            grad = -1 if isinstance(module, FrozenFp8LMHead) else cast
            total += cast * module.in_features + grad * module.out_features
    return total


def copy_bandwidth(device: torch.device, gib: float = 1.0) -> float:
    """Bytes per second of a device-to-device copy (read + write counted), the price of a memory-bound pass."""
    src = torch.empty(int(gib * 2**30), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = statistics.median(time_calls_ms(lambda: dst.copy_(src), 10, warmup=2))
    return 2 * src.numel() / (ms / 1e3)


def split_step(
    events: Iterable[Any], adapter_widths: Collection[int], converted: set[tuple[int, int, int]]
) -> dict[str, float]:
    """Kernel time (ms) of one profiled step's linear GEMMs: adapter GEMMs (a dimension is one of `adapter_widths`:
    the rank, or the summed ranks of adapters projected together; lora.layers.adapter_gemm_widths), base GEMMs, and of
    those the ones the FP8 base converts (`converted`: problem keys of the FP8 linears' GEMMs)."""
    adapter = base = base_converted = 0.0
    for problem, us in linear_gemm_calls(events):
        if problem is not None and any(width in problem for width in adapter_widths):
            adapter += us
        else:
            base += us
            base_converted += us if problem in converted else 0.0
    ms = {"adapter_gemm_ms": adapter, "base_gemm_ms": base, "base_converted_gemm_ms": base_converted}
    return {name: us / 1e3 for name, us in ms.items()}


def split_fp8_step_by_kernel_name(kernels: StepBreakdown) -> dict[str, float]:
    """split_step for an FP8 base whose every linear runs in FP8, from a profile whose kernels are classified by name
    (under CUDA graphs the profiler links no kernel to the op that launched it, so no GEMM's shape is known): its FP8
    GEMMs are the base's, its BF16 GEMMs the adapters'."""
    base = kernels.fp8_gemm_ms
    return {"adapter_gemm_ms": kernels.linear_gemm_ms - base, "base_gemm_ms": base, "base_converted_gemm_ms": base}


def _every_linear_converted(config: RunConfig) -> bool:
    """Whether the FP8 base of `config` (its FP8 settings resolved, as a build plan has them) runs every linear,
    lm_head included, in FP8: the condition for split_fp8_step_by_kernel_name to count every BF16 GEMM as an
    adapter's."""
    return all(s.converted for s in linear_gemm_shapes(config.model, config.train.batch_size, config.fp8))


def _measure_base(
    fp8_plan: Plan,
    use_fp8: bool,
    tokens: tuple[np.ndarray, np.ndarray],
    converted: set[tuple[int, int, int]],
    every_linear_fp8: bool,
    *,
    steps: int,
    timing_steps: int,
    top_kernels: int,
    log: Callable[[str], Any],
) -> dict[str, Any]:
    """The record of one base, FP8 or BF16 (`use_fp8`): trained `steps` steps (the sweep's measurements), then
    `timing_steps` steps timed for the step's wall time and one profiled for its split (split_step) and the GPU's
    idle time. The model and its trainer are freed before returning, so that the other base has the GPU's memory to
    itself."""
    from cs336_basics.build import build
    from cs336_basics.diagnostics.measurement import release_memory, train_for_measurement
    from cs336_basics.lora.layers import adapter_gemm_widths

    config, device = fp8_plan.config, fp8_plan.device
    tokens_per_step = config.train.batch_size * config.model.context_length * config.train.gradient_accumulation_steps
    name = "FP8" if use_fp8 else "BF16"
    log(f"[lora] {name} base: {steps} steps, {timing_steps} timed, 1 profiled ...")
    torch.cuda.reset_peak_memory_stats(device)
    built = build(fp8_plan.with_fp8(use_fp8))
    trainer, result = train_for_measurement(built, *tokens, log)
    step_ms = statistics.median(time_calls_ms(trainer.train_step, timing_steps))
    events = profiled_steps(trainer)
    kernels = breakdown_from_events(events, top_kernels=top_kernels)
    split, split_method = split_step(events, adapter_gemm_widths(built.model), converted), "by GEMM shape"
    if not any(split.values()) and use_fp8 and every_linear_fp8:
        split, split_method = split_fp8_step_by_kernel_name(kernels), "by kernel name (FP8: base, BF16: adapters)"
        log(f"[lora] {name} base: no kernel linked to its op (CUDA graphs), so its GEMMs are split {split_method}")
    timeline = gpu_timeline(events)
    gaps = ", ".join(f"{ms:.2f} ms after {before} before {after}" for ms, before, after in timeline.gaps[:5])
    log(f"[lora] {name} base: GPU idle {timeline.idle_ms(step_ms):.1f} of {step_ms:.1f} ms; longest gaps: {gaps}")
    top = "\n".join(f"  {ms:8.3f} ms  {launches:6.1f} x  {kernel}" for kernel, ms, launches in kernels.top_kernels)
    log(f"[lora] {name} base: the {len(kernels.top_kernels)} kernels with the most time per step:\n{top}")
    gemm_ms = split["adapter_gemm_ms"] + split["base_gemm_ms"]
    record = run_record(
        built.config, tokens_per_sec=result.tokens_per_sec, mfu=result.mfu, compile_s=result.compile_s,
        loss=result.loss, peak_mem_gib=torch.cuda.max_memory_allocated(device) / 2**30, steps=steps,
        step_time_ms=1e3 * tokens_per_step / result.tokens_per_sec, profiled_step_ms=step_ms, **split,
        non_gemm_kernel_ms=kernels.kernel_ms - gemm_ms, attention_ms=kernels.attention_ms,
        gpu_idle_ms=timeline.idle_ms(step_ms), split_method=split_method, top_kernels=kernels.top_kernels,
        cast_bytes_per_step=cast_bytes_per_token(built.model) * tokens_per_step if use_fp8 else 0,
    )  # fmt: skip
    del trainer, built, events
    release_memory()
    return record


def _split_casts_and_rest(bf16: dict[str, Any], fp8: dict[str, Any]) -> None:
    """Complete both records' split of the step: the casts (FP8's extra non-GEMM kernel time over the BF16 base's;
    none on the BF16 base) and the rest (the step's wall time minus the GEMMs and the casts)."""
    fp8["cast_ms"] = fp8["non_gemm_kernel_ms"] - bf16["non_gemm_kernel_ms"]
    for r in (bf16, fp8):
        r.setdefault("cast_ms", 0.0)
        r["rest_ms"] = r["profiled_step_ms"] - r["adapter_gemm_ms"] - r["base_gemm_ms"] - r["cast_ms"]


def _add_predictions(
    bf16: dict[str, Any], fp8: dict[str, Any], shapes: list[GemmShape], device: torch.device, log: Callable[[str], Any]
) -> None:
    """The three predictions of the FP8 base's speedup (see the module's docstring) on the FP8 record, from the BF16
    base's split, the converted base GEMMs timed alone and this GPU's copy bandwidth."""
    log("[lora] timing the converted base GEMMs alone (BF16 vs FP8) and the copy bandwidth ...")
    gemm_speedup = time_matmuls(shapes, device, "tensorwise").speedup
    bandwidth = copy_bandwidth(device)
    t_bf16 = bf16["profiled_step_ms"]
    base_share = bf16["base_converted_gemm_ms"] / t_bf16
    predicted_cast_ms = 1e3 * fp8["cast_bytes_per_step"] / bandwidth
    ours_ms = t_bf16 - bf16["base_converted_gemm_ms"] * (1 - 1 / gemm_speedup) + predicted_cast_ms
    fp8.update(
        adapter_share=bf16["adapter_gemm_ms"] / t_bf16,
        base_gemm_share=base_share,
        base_gemm_speedup=gemm_speedup,
        in_situ_base_gemm_speedup=bf16["base_gemm_ms"] / fp8["base_gemm_ms"] if fp8["base_gemm_ms"] else math.nan,
        copy_bandwidth_gbs=bandwidth / 1e9,
        predicted_cast_ms=predicted_cast_ms,
        predicted_speedup_simple=simple_prediction(bf16["adapter_gemm_ms"] / t_bf16),
        predicted_speedup_base_gemms=base_gemm_prediction(base_share, gemm_speedup),
        predicted_speedup_ours=t_bf16 / ours_ms,
        profiled_speedup=t_bf16 / fp8["profiled_step_ms"],
    )


def analyse_lora(
    config: RunConfig,
    steps: int = 12,
    timing_steps: int = 10,
    top_kernels: int = 8,
    log: Callable[[str], Any] = print,
) -> list[dict[str, Any]]:
    """The BF16-base and FP8-base records of a LoRA configuration (sweep schema plus the step's split and, on the
    FP8 record, the predictions), measured on this CUDA GPU."""
    if not config.finetune.lora:
        raise ConfigError("the LoRA analysis needs a LoRA configuration: --init_from BASE and --lora_rank R.")
    require_cuda("the LoRA analysis", "it times and profiles real steps, FP8 on sm_89+")
    fp8_plan = measurement_plan(config, steps)
    config, device = fp8_plan.config, fp8_plan.device
    tokens = measurement_tokens(config)
    # The frozen base's GEMMs: forward and input gradient (a frozen weight has no weight gradient).
    shapes = [
        s for s in linear_gemm_shapes(config.model, config.train.batch_size, config.fp8) if s.kind != "grad_weight"
    ]
    converted = {s.problem for s in shapes if s.converted}
    # The plan has resolved the FP8 settings (the head's included) that the FP8 base is built with.
    every_linear_fp8 = _every_linear_converted(config)
    measurement = dict(steps=steps, timing_steps=timing_steps, top_kernels=top_kernels, log=log)
    records = [
        _measure_base(fp8_plan, use_fp8, tokens, converted, every_linear_fp8, **measurement)
        for use_fp8 in (False, True)
    ]

    bf16, fp8 = records
    bf16["speedup_vs_bf16"] = 1.0
    fp8["speedup_vs_bf16"] = fp8["tokens_per_sec"] / bf16["tokens_per_sec"]
    if not all(r["adapter_gemm_ms"] + r["base_gemm_ms"] > 0 for r in records):
        # CUDA graphs (compile mode reduce-overhead) replay kernels outside the ops that launched them.
        note = "the profiler linked no GEMM kernel to its op (CUDA graphs?): no split, no predictions"
        log(f"[lora] {note}")
        for r in records:
            r.update(dict.fromkeys(SPLIT_FIELDS), note=note)
        return records
    _split_casts_and_rest(bf16, fp8)
    _add_predictions(bf16, fp8, shapes, device, log)
    return records


def format_lora_table(records: Iterable[dict[str, Any]]) -> str:
    """Markdown: per FP8-base record, the measured speedup, the three predictions and the step's split (ms)."""
    header = (
        "| preset | batch | rank | targets | BF16 base tok/s | FP8 base tok/s | measured | simple | base GEMMs | ours "
        "| adapter GEMMs BF16 / FP8 | base GEMMs BF16 / FP8 | casts FP8 (predicted) | rest BF16 / FP8 "
        "| memory BF16 / FP8 (GiB) |"
    )
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    records = list(records)
    same = lambda a, b: all(a.get(k) == b.get(k) for k in ("preset", "batch_size", "lora_rank", "lora_targets"))  # noqa: E731
    for fp8 in (r for r in records if r.get("precision") != "bf16"):
        bf16 = next(r for r in records if r.get("precision") == "bf16" and same(r, fp8))
        pair = lambda key, bf16=bf16, fp8=fp8: f"{format_or_na(bf16[key], '.1f')} / {format_or_na(fp8[key], '.1f')}"  # noqa: E731
        x = lambda key, spec=".2f", fp8=fp8: format_or_na(fp8.get(key), spec, "x")  # noqa: E731
        casts = f"{format_or_na(fp8['cast_ms'], '.1f')} ({format_or_na(fp8.get('predicted_cast_ms'), '.1f')})"
        lines.append(
            f"| {fp8['preset']} | {fp8['batch_size']} | {fp8['lora_rank']} | {fp8['lora_targets']} "
            f"| {bf16['tokens_per_sec']:,.0f} | {fp8['tokens_per_sec']:,.0f} | {x('speedup_vs_bf16', '.3f')} "
            f"| {x('predicted_speedup_simple')} | {x('predicted_speedup_base_gemms')} "
            f"| {x('predicted_speedup_ours', '.3f')} | {pair('adapter_gemm_ms')} | {pair('base_gemm_ms')} "
            f"| {casts} | {pair('rest_ms')} | {pair('peak_mem_gib')} |"
        )
    return "\n".join(lines)


PREDICTIONS = (("predicted_speedup_simple", "simple rule"), ("predicted_speedup_base_gemms", "base-GEMM Amdahl"),
               ("predicted_speedup_ours", "ours"))  # fmt: skip


def write_lora_plot(path: Path, records: Iterable[dict[str, Any]]) -> Path:
    """The FP8 base's measured speedup against the adapter rank, one line per preset, batch and targets, with the
    three predictions beside it (triangles, squares, crosses; absent where the step was not split)."""
    import matplotlib

    matplotlib.use("Agg")  # headless
    import matplotlib.pyplot as plt

    fp8 = sorted((r for r in records if r.get("precision") != "bf16"), key=lambda r: r["lora_rank"])
    series = list(dict.fromkeys((r["preset"], r["batch_size"], r["lora_targets"]) for r in fp8))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, ax = plt.subplots(figsize=(11, 5))
    for i, key in enumerate(series):
        rows = [r for r in fp8 if (r["preset"], r["batch_size"], r["lora_targets"]) == key]
        ranks = [r["lora_rank"] for r in rows]
        color = colors[i % len(colors)]
        label = "{} batch {} {}".format(*key)
        ax.plot(ranks, [r["speedup_vs_bf16"] for r in rows], "o-", color=color, label=f"{label}: measured")
        for (field, name), style in zip(PREDICTIONS, ("^--", "s:", "x-."), strict=True):
            points = [(k, r[field]) for k, r in zip(ranks, rows, strict=True) if r.get(field) is not None]
            if points:
                ax.plot(*zip(*points, strict=True), style, color=color, alpha=0.6, label=f"{label}: {name}")
    ax.set_xscale("log", base=2)
    ranks = sorted({r["lora_rank"] for r in fp8})
    ax.set_xticks(ranks, labels=[str(k) for k in ranks])
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_xlabel("LoRA rank")
    ax.set_ylabel("FP8 base tokens/s over BF16 base")
    ax.set_title("LoRA on a frozen FP8 base: measured speedup and three predictions")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_random_base(args: argparse.Namespace, path: Path) -> None:
    """A freshly initialised model of the shape the flags give (their seed), saved as a course-layout BF16 state
    dict: a base for speed measurements, where the weights' values do not matter."""
    from cs336_basics.cli import config_from_args
    from cs336_basics.model import TransformerLM

    shape_only = argparse.Namespace(**{**vars(args), "finetune.lora_rank": None, "finetune.init_from": None})
    config = config_from_args(shape_only)
    torch.manual_seed(config.train.seed)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = TransformerLM(config.model).to(torch.bfloat16)
    torch.save(model.state_dict(), path)


def main(argv: list[str] | None = None) -> int:
    from cs336_basics.cli import config_from_args, config_parser, positive_int
    from cs336_basics.errors import report_error
    from cs336_basics.measure.results import append_runs

    parser = config_parser(
        "Where a LoRA step's time goes on a BF16 and an FP8 base, with three predictions of the FP8 speedup.",
        prog="python -m cs336_basics.sweep.lora_analysis",
    )
    parser.add_argument("--steps", type=int, default=12, help="training steps per base (compile included)")
    parser.add_argument(
        "--timing_steps", type=positive_int, default=10, help="CUDA-event-timed steps for the split (median)"
    )
    parser.add_argument(
        "--top_kernels", type=positive_int, default=8, help="how many of each base's costliest kernels to name"
    )
    parser.add_argument("--json", help="append both records to this results file")
    parser.add_argument(
        "--random_base",
        action="store_true",
        help="start from a freshly initialised model of the preset's shape instead of --init_from (speed only)",
    )
    args = parser.parse_args(argv)
    try:
        with tempfile.TemporaryDirectory(prefix="cs336-lora-base-") as tmp:
            if args.random_base:
                setattr(args, "finetune.init_from", str(Path(tmp) / "base.pt"))
                write_random_base(args, Path(tmp) / "base.pt")
            records = analyse_lora(
                config_from_args(args), steps=args.steps, timing_steps=args.timing_steps, top_kernels=args.top_kernels
            )
    except ConfigError as exc:
        return report_error(exc)
    print(format_lora_table(records))
    if args.json:
        append_runs(args.json, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
