"""Measuring the two numbers of the Amdahl model on a GPU: the GEMM microbenchmark (s: FP8 vs BF16 speed of each
converted GEMM, alone), the profile of one warm training step (X: the converted GEMMs' share of the BF16 step, and
where the rest of the time goes), and `analyse`, which runs both precisions of one preset end to end."""

from __future__ import annotations

import dataclasses
import math
import re
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from cs336_basics.compiled import PROFILED_WRAPPER
from cs336_basics.config import FP8_RECIPES, FP8Config, ModelConfig, RunConfig
from cs336_basics.devices import require_cuda
from cs336_basics.diagnostics.amdahl.law import (
    GemmShape,
    MatmulTimings,
    _merge,
    amdahl_prediction,
    cast_overhead_ms,
    linear_gemm_shapes,
    predicted_step_ms,
    problem_key,
)
from cs336_basics.diagnostics.amdahl.report import AmdahlRow
from cs336_basics.errors import ConfigError
from cs336_basics.measure.timing import calls_per_round, time_calls_ms
from cs336_basics.precision.rules import fp8_gemm_dims
from cs336_basics.precision.support import MIN_FP8_CAPABILITY

if TYPE_CHECKING:
    from cs336_basics.build import Plan
    from cs336_basics.precision import FP8ConversionReport

# CPU ops whose kernels are nn.Linear GEMMs (eager and inductor's extern_kernels.mm both dispatch to these).
LINEAR_GEMM_OPS = ("aten::mm", "aten::addmm", "aten::_scaled_mm")
FP8_GEMM_OP = "aten::_scaled_mm"
# Batched GEMMs come from attention's math backend, never from an nn.Linear: reported apart.
OTHER_GEMM_OPS = ("aten::bmm", "aten::baddbmm")
ATTENTION_OP_PATTERNS = (
    "scaled_dot_product",
    "flash_attention",
    "efficient_attention",
    "cudnn_attention",
    "flash_attn",
)
# Fallback when the profiler did not link kernels to CPU ops: classify kernels by name.
GEMM_KERNEL_PATTERNS = ("gemm", "nvjet", "cutlass", "xmma", "sm90", "sm80", "cublas")
ATTENTION_KERNEL_PATTERNS = ("flash", "fmha", "attention", "attn", "sdpa")
# FP8 GEMM kernels: cuBLAS's nvjet names FP8 operands q (E4M3) and r (E5M2), e.g. nvjet_sm90_qqtst_... (E4M3 x
# E4M3) and nvjet_sm90_qrtst_... (E4M3 x E5M2, torchao's hybrid gradients); xmma/cutlass kernels spell e4m3 out.
FP8_KERNEL_RE = re.compile(r"e4m3|e5m2|fp8|f8f8|nvjet_(?:sm\d+_)?[qr]{2}t", re.IGNORECASE)


def _cuda_device(device: torch.device | str | None, what: str) -> torch.device:
    return require_cuda(
        what,
        "it times real BF16 and FP8 GEMMs / training steps; the Amdahl math (amdahl_prediction, cast_overhead_ms) and "
        "linear_gemm_shapes work anywhere",
        device,
    )


def _fast_accum(recipe: str) -> dict[str, bool]:
    """Whether torchao runs each GEMM with fast accumulation (read from its config; torchao 0.18 defaults)."""
    try:
        from cs336_basics.precision import torchao_float8_config

        cfg = torchao_float8_config(FP8Config(fp8_recipe=recipe))
        return {
            "forward": cfg.gemm_config_output.use_fast_accum,
            "grad_input": cfg.gemm_config_grad_input.use_fast_accum,
            "grad_weight": cfg.gemm_config_grad_weight.use_fast_accum,
        }
    except Exception:  # noqa: BLE001 - no torchao: its defaults
        return {"forward": True, "grad_input": False, "grad_weight": False}


def _time_ms(fn: Callable[[], Any], warmup: int, repeats: int, min_round_ms: float) -> float:
    """Median per-call GPU time of fn over `repeats` rounds of back-to-back calls."""
    for _ in range(warmup):
        fn()
    return statistics.median(time_calls_ms(fn, repeats, batch=calls_per_round(fn, min_round_ms)))


def _gemm_operands(shape: GemmShape, device: torch.device, gen: torch.Generator):
    """BF16 operands laid out as autograd has them: forward x @ W^T (B column-major), grad_input g @ W
    (both row-major), grad_weight g^T @ x (A column-major)."""

    def rand(rows: int, cols: int) -> torch.Tensor:
        return torch.randn(rows, cols, device=device, dtype=torch.bfloat16, generator=gen)

    m, k, n = shape.m, shape.k, shape.n
    if shape.kind == "forward":
        return rand(m, k), rand(n, k).t()
    if shape.kind == "grad_weight":
        return rand(k, m).t(), rand(k, n)
    return rand(m, k), rand(k, n)


def _fp8_gemm(shape: GemmShape, device: torch.device, gen: torch.Generator, recipe: str, fast_accum: bool):
    """torch._scaled_mm as torchao calls it: E4M3 operands, A row-major, B column-major, bf16 out; tensorwise:
    scalar fp32 scales; rowwise: per-row (M x 1) and per-column (1 x N) scales, which torchao uses only with fast
    accumulation (otherwise it runs the tensorwise kernel and rescales the output, a separate op not timed here)."""
    e4m3 = torch.float8_e4m3fn
    m, k, n = shape.m, shape.k, shape.n
    a = torch.randn(m, k, device=device, generator=gen).to(e4m3)
    b = torch.randn(n, k, device=device, generator=gen).to(e4m3).t()
    if recipe != "tensorwise" and fast_accum:
        scale_a = torch.rand(m, 1, device=device, generator=gen) + 0.5
        scale_b = torch.rand(1, n, device=device, generator=gen) + 0.5
    else:
        scale_a = torch.tensor(0.75, device=device)
        scale_b = torch.tensor(1.25, device=device)

    def run() -> torch.Tensor:
        return torch._scaled_mm(
            a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16, use_fast_accum=fast_accum
        )

    return run


def time_matmuls(
    shapes: Iterable[GemmShape],
    device: torch.device | str | None = None,
    recipe: str = "tensorwise",
    *,
    warmup: int = 5,
    repeats: int = 10,
    min_round_ms: float = 2.0,
) -> MatmulTimings:
    """Microbenchmark each distinct GEMM: BF16 torch.mm against FP8 torch._scaled_mm, the GEMM alone (no casts).

    Returns per-shape (bf16_ms, fp8_ms) per call, median over `repeats` rounds, and `.speedup`: the aggregate s
    over the converted GEMMs. FP8 time is nan where _scaled_mm cannot run the shape (dims not multiples of 16).
    """
    device = _cuda_device(device, "time_matmuls")
    if recipe not in FP8_RECIPES:
        raise ConfigError(f"recipe must be one of {FP8_RECIPES}, got {recipe!r}.")
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_FP8_CAPABILITY:
        raise ConfigError(
            f"{torch.cuda.get_device_name(device)} (sm_{capability[0]}{capability[1]}) has no FP8 tensor cores; "
            "FP8 GEMMs need sm_89+ (Ada, Hopper, Blackwell)."
        )
    fast_accum = _fast_accum(recipe)
    gen = torch.Generator(device=device).manual_seed(0)
    timings = MatmulTimings(recipe=recipe)
    with torch.cuda.device(device), torch.no_grad():
        for shape in _merge(shapes):
            a, b = _gemm_operands(shape, device, gen)
            bf16_ms = _time_ms(lambda a=a, b=b: torch.mm(a, b), warmup, repeats, min_round_ms)
            del a, b
            fp8_ms = math.nan
            if fp8_gemm_dims(shape.k, shape.n):
                try:
                    run = _fp8_gemm(shape, device, gen, recipe, fast_accum[shape.kind])
                    fp8_ms = _time_ms(run, warmup, repeats, min_round_ms)
                    del run
                except RuntimeError:  # a shape or layout this torch/cuBLAS cannot run in FP8
                    fp8_ms = math.nan
            timings.times[shape] = (bf16_ms, fp8_ms)
            torch.cuda.empty_cache()
    return timings


# ---- profiling one training step ----


@dataclass
class StepBreakdown:
    """Where one training step's GPU time goes, per step.

    step_ms is wall time (median of CUDA-event-timed steps, outside the profiler); the rest are summed kernel
    durations from one profiled step. linear_gemm_ms covers every nn.Linear GEMM, the lm_head included;
    converted_gemm_ms the GEMMs of the linears FP8 converts (in an FP8 model: the aten::_scaled_mm kernels; in a
    BF16 model: attributed by GEMM shape, see `attribution`).
    """

    step_ms: float
    kernel_ms: float
    linear_gemm_ms: float
    converted_gemm_ms: float
    fp8_gemm_ms: float = 0.0
    attention_ms: float = 0.0
    other_gemm_ms: float = 0.0
    unmatched_gemm_ms: float = 0.0
    n_linear_gemm_calls: int = 0
    n_scaled_mm_calls: int = 0
    # "cpu-op": kernels attributed via their CPU op (aten::mm / addmm / _scaled_mm); "kernel-name": by name.
    method: str = "cpu-op"
    # How converted_gemm_ms was found: "fp8-ops" (the _scaled_mm kernels), "shape" (BF16 GEMMs matched to the
    # converted linears' shapes; a shape shared by converted and unconverted linears is split by count), "flops"
    # (no shapes recorded: split by the converted share of linear FLOPs), or "none" (no shape table given).
    attribution: str = "shape"
    steps_profiled: int = 1
    step_ms_samples: list[float] = field(default_factory=list)
    # (kernel name, ms per step, launches per step) of the kernels with the most time, most first.
    top_kernels: list[tuple[str, float, float]] = field(default_factory=list)

    @property
    def linear_share(self) -> float:
        return self.linear_gemm_ms / self.step_ms

    @property
    def converted_share(self) -> float:
        return self.converted_gemm_ms / self.step_ms

    @property
    def non_gemm_kernel_ms(self) -> float:
        return self.kernel_ms - self.linear_gemm_ms

    def to_dict(self) -> dict[str, Any]:
        return {
            **dataclasses.asdict(self),
            "linear_share": self.linear_share,
            "converted_share": self.converted_share,
            "non_gemm_kernel_ms": self.non_gemm_kernel_ms,
        }


def is_device_event(event: Any) -> bool:
    from torch.autograd import DeviceType

    # GPU-side user annotations (inductor wraps every compiled graph call in "## Call CompiledFxGraph ... ##")
    # span many kernels: counting them as kernels would double the step's kernel time.
    return getattr(event, "device_type", None) == DeviceType.CUDA and not getattr(event, "is_user_annotation", False)


def _duration_us(event: Any) -> float:
    return event.time_range.end - event.time_range.start


def _kernel_us(event: Any) -> float:
    # A kernel named like its op is the legacy elapsed-time fallback, not a real kernel: never count it twice.
    return sum(k.duration for k in getattr(event, "kernels", ()) or () if k.name != event.name)


def _gemm_problem(event: Any) -> tuple[int, int, int] | None:
    shapes = [list(s) for s in (getattr(event, "input_shapes", None) or [])]
    operands = shapes[1:3] if event.name in ("aten::addmm", "aten::baddbmm") else shapes[:2]
    if len(operands) != 2 or any(len(s) != 2 for s in operands):
        return None
    (m, k), (k2, n) = operands
    return problem_key(m, k, n) if k == k2 else None


def _matches(name: str, patterns: Iterable[str]) -> bool:
    lowered = name.lower()
    return any(p in lowered for p in patterns)


def linear_gemm_calls(events: Iterable[Any]) -> list[tuple[tuple[int, int, int] | None, float]]:
    """(problem key, kernel us) of every linear GEMM call (aten::mm / addmm / _scaled_mm) of a profile whose kernels
    the profiler linked to their CPU op; the problem is None where no 2-D shapes were recorded."""
    ops = [e for e in events if not is_device_event(e) and e.name in LINEAR_GEMM_OPS]
    return [(_gemm_problem(e), _kernel_us(e)) for e in ops]


@dataclass(frozen=True)
class GpuTimeline:
    """When a profile's kernels kept the GPU busy: busy_ms is the union of their intervals (overlapping kernels
    counted once), gaps the idle stretches between them, longest first, as (ms, kernel before, kernel after)."""

    busy_ms: float
    gaps: list[tuple[float, str, str]]

    def idle_ms(self, step_ms: float) -> float:
        """The GPU's idle time in a step of wall time `step_ms` (its kernels' busy time taken from this profile)."""
        return max(step_ms - self.busy_ms, 0.0)


def gpu_timeline(events: Iterable[Any], steps: int = 1) -> GpuTimeline:
    """Busy time and idle gaps (per step) of a profile's device events. Pure, like breakdown_from_events."""
    kernels = sorted((e.time_range.start, e.time_range.end, e.name) for e in events if is_device_event(e))
    busy_us, gaps = 0.0, []
    if kernels:
        start, end, name = kernels[0]
        for k_start, k_end, k_name in kernels[1:]:
            if k_start > end:
                busy_us += end - start
                gaps.append(((k_start - end) / 1e3, name[:60], k_name[:60]))
                start = k_start
            if k_end >= end:
                end, name = k_end, k_name
        busy_us += end - start
    return GpuTimeline(busy_ms=busy_us / 1e3 / max(1, steps), gaps=sorted(gaps, reverse=True))


@dataclass
class _GemmTimes:
    """A profile's GEMM and attention kernel time in us (all profiled steps together), classified one way
    (`method`); bf16_linear keeps each BF16 linear GEMM call as (problem key or None, kernel us) so that its time can
    be attributed to the converted linears afterwards."""

    method: str
    fp8_us: float = 0.0
    other_gemm_us: float = 0.0
    attention_us: float = 0.0
    n_linear: int = 0
    n_scaled: int = 0
    bf16_linear: list[tuple[tuple[int, int, int] | None, float]] = field(default_factory=list)

    @property
    def linear_us(self) -> float:
        return self.fp8_us + sum(us for _, us in self.bf16_linear)


def _gemm_times_by_op(cpu_ops: list[Any], linear_ops: list[Any], other_ops: list[Any]) -> _GemmTimes:
    """Classify by the CPU op each kernel was launched from (the profiler linked them): exact, and the recorded input
    shapes give each BF16 GEMM its problem."""
    times = _GemmTimes(method="cpu-op")
    for e in linear_ops:
        times.n_linear += 1
        if e.name == FP8_GEMM_OP:
            times.n_scaled += 1
            times.fp8_us += _kernel_us(e)
        else:
            times.bf16_linear.append((_gemm_problem(e), _kernel_us(e)))
    times.other_gemm_us = sum(_kernel_us(e) for e in other_ops)
    times.attention_us = sum(
        _kernel_us(e) for e in cpu_ops if e.name not in LINEAR_GEMM_OPS and _matches(e.name, ATTENTION_OP_PATTERNS)
    )
    return times


def _gemm_times_by_kernel_name(device_events: list[Any]) -> _GemmTimes:
    """The fallback when no kernel is linked to its CPU op: classify the kernels by name. No shapes are known, and
    batched GEMMs cannot be told from linear ones (they count as linear)."""
    times = _GemmTimes(method="kernel-name")
    for e in device_events:
        if _matches(e.name, ATTENTION_KERNEL_PATTERNS):
            times.attention_us += _duration_us(e)
        elif _matches(e.name, GEMM_KERNEL_PATTERNS):
            times.n_linear += 1
            if FP8_KERNEL_RE.search(e.name):
                times.n_scaled += 1
                times.fp8_us += _duration_us(e)
            else:
                times.bf16_linear.append((None, _duration_us(e)))
    return times


def _converted_counts(shapes: list[GemmShape]) -> dict[tuple[int, int, int], list[int]]:
    """problem -> [converted count, total count] over the step's GEMMs: BF16 time on a problem that converted and
    unconverted linears share is attributed to the converted ones in that proportion."""
    table: dict[tuple[int, int, int], list[int]] = {}
    for s in shapes:
        entry = table.setdefault(s.problem, [0, 0])
        entry[0] += s.count if s.converted else 0
        entry[1] += s.count
    return table


def _converted_flops_share(shapes: list[GemmShape]) -> float:
    """The converted GEMMs' share of the linear GEMM FLOPs: the split of a BF16 GEMM whose shape was not recorded."""
    total_flops = sum(s.flops * s.count for s in shapes)
    return sum(s.flops * s.count for s in shapes if s.converted) / total_flops if total_flops else 0.0


def _converted_gemm_us(times: _GemmTimes, shapes: list[GemmShape]) -> tuple[float, str, float]:
    """(converted us, attribution, unmatched us): which linear GEMM time belongs to the linears FP8 converts (see
    StepBreakdown.attribution), and the BF16 GEMM time whose shape matches no linear."""
    table = _converted_counts(shapes)
    flops_share = _converted_flops_share(shapes)
    unmatched_us = 0.0
    if times.n_scaled:  # an FP8 model: its converted GEMMs are the FP8 ones, every BF16 GEMM is an unconverted linear
        converted_us, attribution = times.fp8_us, "fp8-ops"
        unmatched_us = sum(us for p, us in times.bf16_linear if p is not None and table and p not in table)
    elif not shapes:
        converted_us, attribution = 0.0, "none"
    elif any(p is not None for p, _ in times.bf16_linear):
        converted_us, attribution = 0.0, "shape"
        for problem, us in times.bf16_linear:
            if problem is None:
                converted_us += us * flops_share
            elif problem in table:
                converted, total = table[problem]
                converted_us += us * converted / total
            else:
                unmatched_us += us
    else:
        converted_us, attribution = sum(us for _, us in times.bf16_linear) * flops_share, "flops"
    return converted_us, attribution, unmatched_us


def _top_kernels_us(device_events: list[Any], n: int) -> list[tuple[str, float, int]]:
    """The `n` kernels (by name) with the most total time: (name, us, launches), most time first."""
    per_kernel: dict[str, list[float]] = {}
    for e in device_events:
        total = per_kernel.setdefault(e.name, [0.0, 0])
        total[0] += _duration_us(e)
        total[1] += 1
    ranked = sorted(per_kernel.items(), key=lambda kv: -kv[1][0])[:n]
    return [(name, us, launches) for name, (us, launches) in ranked]


def breakdown_from_events(
    events: Iterable[Any],
    shapes: Iterable[GemmShape] = (),
    steps: int = 1,
    step_ms_samples: Iterable[float] = (),
    top_kernels: int = 8,
) -> StepBreakdown:
    """Classify a profile's events (torch.profiler FunctionEvents: CPU ops with .kernels, and device events)
    into a per-step StepBreakdown. Pure: works on any objects with the same attributes."""
    events = list(events)
    shapes = list(shapes)
    device_events = [e for e in events if is_device_event(e)]
    cpu_ops = [e for e in events if not is_device_event(e)]

    linear_ops = [e for e in cpu_ops if e.name in LINEAR_GEMM_OPS]
    other_ops = [e for e in cpu_ops if e.name in OTHER_GEMM_OPS]
    if any(_kernel_us(e) > 0 for e in linear_ops + other_ops):
        times = _gemm_times_by_op(cpu_ops, linear_ops, other_ops)
    else:
        times = _gemm_times_by_kernel_name(device_events)
    # Without device rows in this profiler's event list, the kernels attached to the CPU ops.
    kernel_us = sum([_duration_us(e) for e in device_events] or [_kernel_us(e) for e in cpu_ops])
    converted_us, attribution, unmatched_us = _converted_gemm_us(times, shapes)

    steps = max(1, steps)
    ms = lambda us: us / 1e3 / steps
    samples = list(step_ms_samples)
    return StepBreakdown(
        step_ms=statistics.median(samples) if samples else math.nan,
        kernel_ms=ms(kernel_us),
        linear_gemm_ms=ms(times.linear_us),
        converted_gemm_ms=ms(converted_us),
        fp8_gemm_ms=ms(times.fp8_us),
        attention_ms=ms(times.attention_us),
        other_gemm_ms=ms(times.other_gemm_us),
        unmatched_gemm_ms=ms(unmatched_us),
        n_linear_gemm_calls=times.n_linear // steps,
        n_scaled_mm_calls=times.n_scaled // steps,
        method=times.method,
        attribution=attribution,
        steps_profiled=steps,
        step_ms_samples=samples,
        top_kernels=[
            (name[:100], ms(us), launches / steps) for name, us, launches in _top_kernels_us(device_events, top_kernels)
        ],
    )


def profile_step_breakdown(
    trainer: Any,
    shapes: Iterable[GemmShape] | None = None,
    *,
    profile_steps: int = 1,
    timing_steps: int = 5,
    top_kernels: int = 8,
) -> StepBreakdown:
    """Time `timing_steps` warm training steps with CUDA events (median: the wall step time T), then profile
    `profile_steps` more with torch.profiler (CPU + CUDA, shapes recorded) and classify their kernels (the
    `top_kernels` with the most time named).

    The trainer must already be warm (compiled, optimizer state allocated): train a few steps first. `shapes`
    defaults to linear_gemm_shapes(trainer's model config, batch size, trainer's FP8 config)."""
    device = torch.device(trainer.device)
    _cuda_device(device, "profile_step_breakdown")
    if shapes is None:
        model_config = getattr(trainer.model, "config", None)
        shapes = (
            linear_gemm_shapes(model_config, trainer.config.train.batch_size, trainer.config.fp8)
            if isinstance(model_config, ModelConfig)
            else []
        )
    samples = time_calls_ms(trainer.train_step, timing_steps)
    events = profiled_steps(trainer, profile_steps)
    return breakdown_from_events(events, shapes, steps=profile_steps, step_ms_samples=samples, top_kernels=top_kernels)


def profiled_steps(trainer: Any, steps: int = 1) -> list[Any]:
    """The profiler's events (CPU ops with their shapes, CUDA kernels) of `steps` more warm training steps."""
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
        for _ in range(max(1, steps)):
            trainer.train_step()
        torch.cuda.synchronize(torch.device(trainer.device))
    return list(prof.events())


def measurement_plan(config: RunConfig, steps: int, device: torch.device | str | None = None) -> Plan:
    """The build plan of a measurement of both precisions: `steps` training steps (logged at the last), FP8 on, so
    that planning makes the FP8 checks train_h100.py makes; `.with_fp8(False)` gives its BF16 twin. Its steps are
    profiled: inductor's wrapper is compiled.PROFILED_WRAPPER unless asked otherwise."""
    from cs336_basics.build import plan

    train = {"max_steps": steps, "log_every": steps}
    if config.train.compile_wrapper == "auto":
        train["compile_wrapper"] = PROFILED_WRAPPER
    if device is not None:
        train["device"] = str(device)
    return plan(config.replace(train=train).with_fp8(True))


def measurement_tokens(config: RunConfig, data: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """(train, val) token arrays from `data`: a PreparedData, a (train, val) pair of token arrays, or None for
    prepare_data(config.data, vocab)."""
    from cs336_basics.data import PreparedData, prepare_data

    if data is None:
        data = prepare_data(config.data, config.model.vocab_size)
    train_tokens, val_tokens = (data.train, data.val) if isinstance(data, PreparedData) else data
    return np.asarray(train_tokens), np.asarray(val_tokens)


def _check_analysis_request(device: torch.device | str | None, steps: int) -> None:
    """Refuse, before any work, a machine without CUDA, a device that is not a GPU, and too few steps to warm up."""
    require_cuda("the Amdahl analysis", "it profiles real BF16 and FP8 training steps, FP8 on sm_89+", device)
    if steps < 3:
        raise ConfigError(f"steps must be at least 3 (the first compiles, the second settles), got {steps}.")


def _measure_precision(
    precision_plan: Plan,
    tokens: tuple[np.ndarray, np.ndarray],
    shapes: list[GemmShape],
    log: Callable[[str], Any],
    *,
    profile_steps: int,
    timing_steps: int,
    top_kernels: int,
) -> tuple[StepBreakdown, FP8ConversionReport | None]:
    """Build one precision's model (seeded: the BF16 and FP8 twins start from the same weights), train it (compile,
    warm-up), then time and profile its steps; (its StepBreakdown, its FP8 conversion report). The model and its
    trainer are freed before returning, so that the other precision has the GPU's memory to itself."""
    from cs336_basics.build import build
    from cs336_basics.diagnostics.measurement import release_memory, train_for_measurement

    built = build(precision_plan)
    trainer, _ = train_for_measurement(built, *tokens, log)
    breakdown = profile_step_breakdown(
        trainer, shapes, profile_steps=profile_steps, timing_steps=timing_steps, top_kernels=top_kernels
    )
    conversion = built.conversion
    del trainer, built
    release_memory()
    return breakdown, conversion


def _clamped_share(bf16: StepBreakdown, notes: list[str]) -> float:
    """X, the converted GEMMs' share of the BF16 step, clamped to [0, 1] (noted in `notes` when it was outside): its
    kernel time comes from the profiled steps, its wall time from the unprofiled ones."""
    x = bf16.converted_share
    if not 0.0 <= x <= 1.0:
        notes.append(f"X measured as {x:.4f}, clamped to [0, 1] (profiled kernel time vs unprofiled wall time)")
        x = min(max(x, 0.0), 1.0)
    return x


def amdahl_row(
    config: RunConfig,
    device: torch.device,
    bf16: StepBreakdown,
    fp8: StepBreakdown,
    conversion: FP8ConversionReport,
    timings: MatmulTimings,
    notes: list[str],
) -> AmdahlRow:
    """The prediction from X (the BF16 profile) and s (the GEMM microbenchmark) set beside the measured FP8 step."""
    s = timings.speedup
    x = _clamped_share(bf16, notes)
    if bf16.unmatched_gemm_ms > 0:
        notes.append(f"{bf16.unmatched_gemm_ms:.2f} ms/step of BF16 mm kernels matched no linear shape (not in X)")
    t_bf16, t_fp8 = bf16.step_ms, fp8.step_ms
    in_situ = bf16.converted_gemm_ms / fp8.fp8_gemm_ms if fp8.fp8_gemm_ms > 0 else math.nan
    return AmdahlRow(
        preset=config.preset,
        batch_size=config.train.batch_size,
        linear_share=x,
        matmul_speedup=s,
        predicted_speedup=amdahl_prediction(x, s),
        measured_speedup=t_bf16 / t_fp8,
        predicted_fp8_step_ms=predicted_step_ms(t_bf16, x, s),
        measured_fp8_step_ms=t_fp8,
        cast_overhead_ms=cast_overhead_ms(t_bf16, t_fp8, x, s),
        n_converted=conversion.n_converted,
        n_linear=conversion.n_linear,
        recipe=config.fp8.fp8_recipe,
        seq_len=config.model.context_length,
        bf16_step_ms=t_bf16,
        all_linear_share=bf16.linear_share,
        in_situ_matmul_speedup=in_situ,
        profiled_fp8_extra_ms=fp8.non_gemm_kernel_ms - bf16.non_gemm_kernel_ms,
        method=bf16.method if bf16.method == fp8.method else f"bf16 {bf16.method}, fp8 {fp8.method}",
        attribution=bf16.attribution,
        compile=config.train.compile_mode if config.train.compile_model else False,
        gpu=torch.cuda.get_device_name(device),
        notes=notes,
        shapes=timings.rows(),
        bf16_breakdown=bf16.to_dict(),
        fp8_breakdown=fp8.to_dict(),
    )


def analyse(
    config: RunConfig,
    device: torch.device | str | None = None,
    steps: int = 8,
    *,
    data: Any = None,
    profile_steps: int = 1,
    timing_steps: int = 5,
    top_kernels: int = 8,
    log: Callable[[str], Any] = print,
) -> AmdahlRow:
    """Predicted (Amdahl) vs measured FP8 speedup for config's model and batch, on a CUDA GPU.

    BF16 model (seeded) -> Trainer (compiled, `steps` steps) -> timed + profiled steps; the same for the model
    converted with config.fp8 (use_fp8 forced on); then the GEMM microbenchmark at the linears' shapes.
    `data`: a PreparedData, a (train, val) pair of token arrays, or None for prepare_data(config.data, vocab).
    `top_kernels`: how many of each precision's most time-consuming kernels its breakdown names.
    """
    _check_analysis_request(device, steps)
    fp8_plan = measurement_plan(config, steps, device)
    config, device = fp8_plan.config, fp8_plan.device
    if device.type != "cuda":
        raise ConfigError(f"the Amdahl analysis needs a CUDA GPU; the config resolves to {device}.")
    notes = []
    if not config.train.compile_model:
        notes.append("eager (no torch.compile): FP8 casts are not fused, so the overhead is far larger than compiled")
    tokens = measurement_tokens(config, data)
    shapes = linear_gemm_shapes(config.model, config.train.batch_size, config.fp8)

    def measure(use_fp8: bool) -> tuple[StepBreakdown, FP8ConversionReport | None]:
        twin = fp8_plan.with_fp8(use_fp8)
        return _measure_precision(
            twin, tokens, shapes, log, profile_steps=profile_steps, timing_steps=timing_steps, top_kernels=top_kernels
        )

    log(f"[amdahl] BF16: {steps} steps, then {timing_steps} timed and {profile_steps} profiled ...")
    bf16, _ = measure(use_fp8=False)
    log(f"[amdahl] FP8 ({config.fp8.fp8_recipe}): {steps} steps, then {timing_steps} timed and {profile_steps} ...")
    fp8, conversion = measure(use_fp8=True)
    log(f"[amdahl] {conversion.summary_line()}")
    log(f"[amdahl] GEMM microbenchmark: {len(shapes)} distinct shapes ...")
    timings = time_matmuls(shapes, device, config.fp8.fp8_recipe)
    return amdahl_row(config, device, bf16, fp8, conversion, timings, notes)
