"""Prove, on this machine, that FP8 is really applied and really pays.

Five checks, each PASS / FAIL / SKIP with the evidence:
  1. fp8_linears         FP8 linears are in the model (TorchAO's Float8Linear, or the fused path's), as many as the
                         conversion promised.
  2. fp8_gemms_launched  the profiler sees FP8 matmuls (aten::_scaled_mm) in one compiled training step: one per
                         FP8 linear per GEMM (forward, grad_input, grad_weight), but where layers that read one input
                         run their grad_input as one GEMM (the fused path's q/k/v and w1/w3). With emulation (CPU) it
                         counts the FP8 casts instead, since emulated matmuls run in high precision.
  3. no_graph_breaks     dynamo traces the FP8 model's forward (and loss) as one graph.
  4. loss_matches_bf16   after the same steps from the same seed and data, FP8 loss is within a tolerance of BF16.
  5. fp8_speedup         FP8 + compile tokens/s over BF16 + compile tokens/s, measured in this process (GPU only), each
                         in the compile mode and wrapper its run would use (auto: CUDA graphs for FP8 where they
                         apply, else the C++ wrapper). Both hide the step's ops from the profiler: check 2 and the
                         Amdahl profile then run on a twin, same settings, compiled without them.

Then why, the doctor's part (diagnostics/doctor.py): before anything is built, what each conversion policy
(Accelerate's default filter, TorchAO's shape rule, every linear) would convert and the FLOP share and bound it gives,
with the failure modes it can see in the config (no torchao, nothing converted, no compile, dims not divisible by 16,
layers too small); on a GPU, after both runs, the Amdahl row (X: the converted GEMMs' share of a profiled BF16 step;
s: their FP8 speed timed alone; the prediction beside the measured ratio) and what the measured runs say (FP8 slower,
casts costing more than the GEMMs save, more memory), each with its number and what to do. The model is this
package's or a Hugging Face causal LM (--hf_model, built from its config: TorchAO's or Accelerate's path). On this
package's model the FP8 path not chosen (fused or TorchAO's) is trained too and shown beside the chosen one.

A LoRA fine-tune (--init_from BASE --lora_rank R) is not converted: its frozen base runs this package's FP8 linears
(lora/layers.py), whose promise is different (weights cast once; per linear a forward and an input-gradient GEMM,
never a weight-gradient one). Its checks 1 and 2 test that promise, with two more beside check 2:
  1. fp8_linears               frozen FP8 base linears in the model, as many as the LoRA report lists.
  2. fp8_gemms_launched        aten::_scaled_mm calls in one eager step, counted by a dispatch mode (on the CPU too,
                               where the base runs torch._scaled_mm's CPU kernel): 1 to 2 per FP8 linear, so no
                               third (weight-gradient) GEMM; on a GPU the profiled compiled step runs exactly as many.
     no_base_weight_gradients  after a step's backward the adapters (lora_a, lora_b), and only they, hold gradients.
     base_fp8_weights_cast_once  every FP8 base weight was cast once, when its layer was built, never in a step.
  Checks 3-5 as above, against the same LoRA fine-tune on a BF16 base. On CPU a LoRA base is never emulated: it runs
  torch._scaled_mm's CPU kernel (and refuses --fp8_emulate).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from cs336_basics.build import Built, build, plan
from cs336_basics.compiled import PROFILED_WRAPPER, eager, hides_ops_from_profiler
from cs336_basics.config import LORA_FP8_PATH, RunConfig
from cs336_basics.data import PreparedData, get_batch, prepare_data, require_windows
from cs336_basics.devices import resolve_device
from cs336_basics.diagnostics.amdahl.law import GemmShape, linear_gemm_shapes
from cs336_basics.diagnostics.amdahl.measure import StepBreakdown, amdahl_row, profile_step_breakdown, time_matmuls
from cs336_basics.diagnostics.amdahl.report import AmdahlRow
from cs336_basics.diagnostics.doctor import Diagnosis, diagnose_config, measured_findings
from cs336_basics.diagnostics.measurement import release_memory, train_for_measurement
from cs336_basics.errors import ConfigError
from cs336_basics.measure.results import result_record
from cs336_basics.precision.fused.head import logits_row_blocks
from cs336_basics.precision.rules import grad_weight_in_fp8
from cs336_basics.training.trainer import Trainer, TrainResult

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
# The verdict's defaults (verify_fp8_compilation.py's flags): FP8's final loss within 2% of BF16's, and not slower.
LOSS_TOLERANCE = 0.02
MIN_SPEEDUP = 1.0
ADAPTER_NAMES = ("lora_a", "lora_b")  # the last part of an adapter parameter's name (lora/layers.py)


@dataclass
class Check:
    name: str
    status: str  # "PASS", "FAIL" or "SKIP"
    detail: str
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass
class Verification:
    checks: list[Check]
    runs: list[dict[str, Any]]
    support: str
    diagnosis: Diagnosis | None = None  # the doctor's findings: before anything ran, then from the measured runs
    amdahl: AmdahlRow | None = None  # on a GPU (not for a LoRA fine-tune): predicted vs measured FP8 speedup
    paths: list[str] = field(default_factory=list)  # this package's model: each FP8 path's line, side by side

    @property
    def passed(self) -> bool:
        return all(c.status != "FAIL" for c in self.checks)

    def table(self) -> str:
        width = max(len(c.name) for c in self.checks)
        lines = [f"{'check':<{width}}  result  evidence", f"{'-' * width}  ------  --------"]
        lines += [f"{c.name:<{width}}  {c.status:<6}  {c.detail}" for c in self.checks]
        if self.amdahl is not None:
            a = self.amdahl
            lines += [
                "",
                f"why: X = {100 * a.linear_share:.1f}% of the BF16 step in the GEMMs FP8 converts, s = "
                f"{a.matmul_speedup:.2f}x their FP8 speed alone: Amdahl predicts {a.predicted_speedup:.3f}x, "
                f"measured {a.measured_speedup:.3f}x ({a.cast_overhead_ms:+.2f} ms/step besides the GEMMs)",
            ]
        if self.paths:
            lines += ["", "FP8 paths on this model:", *(f"  {p}" for p in self.paths)]
        if self.diagnosis is not None:
            lines += ["", self.diagnosis.format()]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """The JSON fields beside the runs."""
        return {
            "passed": self.passed,
            "skipped": [c.name for c in self.checks if c.status == "SKIP"],
            "checks": [dataclasses.asdict(c) for c in self.checks],
            "diagnosis": self.diagnosis.to_dict() if self.diagnosis is not None else None,
            "amdahl": self.amdahl.to_dict() if self.amdahl is not None else None,
            "paths": self.paths,
        }


def _check(name: str, ok: bool, detail: str, **evidence: Any) -> Check:
    return Check(name, "PASS" if ok else "FAIL", detail, evidence)


class _OpCounter(TorchDispatchMode):
    """Counts the ATen calls `counts(func, out)` accepts; it sees the ops of autograd's backward as well."""

    def __init__(self, counts: Callable[[Any, Any], bool]):
        super().__init__()
        self.counts = counts
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.count += bool(self.counts(func, out))
        return out


def _makes_fp8(func, out) -> bool:
    """An op producing an FP8 tensor: under emulation these casts are where FP8 numerics happen."""
    return any(isinstance(t, torch.Tensor) and t.dtype in FP8_DTYPES for t in tree_leaves(out))


def _is_scaled_mm(func, out) -> bool:
    return func is torch.ops.aten._scaled_mm.default


def _gemms_per_linear(recipe: str) -> int:
    return 3 if grad_weight_in_fp8(recipe) else 2  # forward, grad_input and (recipe permitting) grad_weight


def count_fp8_gemms(trainer: Trainer) -> tuple[int, list[str]]:
    """aten::_scaled_mm calls in one profiled training step, and the names of the GPU kernels they launched."""
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        trainer.train_step()
        torch.cuda.synchronize()
    calls = [e for e in prof.events() if e.name == "aten::_scaled_mm"]
    kernels = sorted({k.name for e in calls for k in e.kernels})
    return len(calls), kernels


def count_graph_breaks(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[int, int]:
    """(graph breaks, graphs) when dynamo traces forward with the loss; explain() runs no inductor, so it is cheap."""
    x, y = batch
    explanation = torch._dynamo.explain(model)(x, targets=y)
    torch._dynamo.reset()
    return explanation.graph_break_count, explanation.graph_count


# ---- pretraining FP8: a converted model ----


def _converted_linears_check(built: Built) -> Check:
    """Check 1: the build stage converted, then counted the FP8 linears itself."""
    report = built.conversion
    return _check(
        "fp8_linears",
        built.fp8_linears == report.n_converted > 0,
        f"{built.fp8_linears} FP8 linears counted, {report.n_converted} expected ({report.summary_line()})",
        counted=built.fp8_linears,
        expected=report.n_converted,
        skipped=report.skipped,
    )


def _converted_gemms_check(built: Built, trainer: Trainer, on_gpu: bool) -> Check:
    """Check 2 in one more step of the (now warm) trainer: FP8 GEMMs on a GPU, FP8 casts under emulation."""
    n, per_linear = built.conversion.n_converted, _gemms_per_linear(built.config.fp8.fp8_recipe)
    if on_gpu:
        scaled_mm, kernels = count_fp8_gemms(trainer)
        joined = sum(getattr(m, "input_gradient_gemms_joined", 0) for m in built.model.modules())
        expected = n * per_linear - joined
        return _check(
            "fp8_gemms_launched",
            scaled_mm >= expected,
            f"{scaled_mm} aten::_scaled_mm calls in one compiled step, >= {expected} expected "
            f"({n} linears x {per_linear} GEMMs, less {joined} input-gradient GEMMs run as one with another's); "
            f"kernels: {', '.join(kernels) or 'not attributed by the profiler'}",
            scaled_mm=scaled_mm,
            kernels=kernels,
            expected=expected,
        )
    counter = _OpCounter(_makes_fp8)
    with counter:
        trainer.train_step()
    return _check(
        "fp8_gemms_launched",
        counter.count >= 2 * n,  # at least input and weight per linear per forward
        f"emulated: {counter.count} FP8 casts in one eager step, >= {2 * n} expected (real FP8 GEMMs need a GPU)",
        fp8_casts=counter.count,
        expected=2 * n,
    )


# ---- LoRA: a frozen FP8 base with adapters ----


def _lora_linears_check(built: Built) -> Check:
    """Check 1: frozen FP8 linears counted in the model (the build stage counts them too) against the LoRA report."""
    report = built.lora
    expected = report.base.n_converted
    return _check(
        "fp8_linears",
        built.fp8_linears == expected > 0,
        f"{built.fp8_linears} frozen FP8 base linears counted, {expected} expected; {len(report.base.skipped)} in "
        f"BF16, {len(report.adapter_layers)} with adapters; {report.trainable:,} trainable, {report.frozen:,} frozen",
        counted=built.fp8_linears,
        expected=expected,
        bf16_layers=report.base.skipped,
        adapter_layers=report.adapter_layers,
        trainable=report.trainable,
        frozen=report.frozen,
    )


def _eager_step(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[int, set[str]]:
    """One forward and backward of the model run eager (the Trainer compiled it in place): its aten._scaled_mm calls
    and the names of the parameters that got a gradient. The gradients are dropped again (no update): the trainer
    clears them after its steps, so they are read here, before anyone does."""
    x, y = batch
    counter = _OpCounter(_is_scaled_mm)
    with counter, eager():
        model(x, targets=y).backward()
    with_grads = {name for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return counter.count, with_grads


def _lora_gemms_check(n: int, head_blocks: int, eager: int, trainer: Trainer, on_gpu: bool) -> Check:
    """Check 2. Autograd runs no input-gradient GEMM for a linear whose input needs no gradient (the first block's
    q/k/v read the frozen embedding), so the exact count is measured in the eager step rather than derived. Each FP8
    linear runs its forward (>= one GEMM each) and at most its input gradient (<= twice that): a weight-gradient GEMM
    would be a third. An FP8 head runs one GEMM per block of rows (`head_blocks`, 0 without an FP8 head) in each.
    The compiled step must run exactly the eager step's GEMMs."""
    per_pass = n + max(head_blocks - 1, 0)
    head = f", the head's in {head_blocks} blocks of rows" if head_blocks else ""
    bounds = (
        f"between {per_pass} (every forward) and {2 * per_pass} (+ input gradients; no weight gradients) for {n} FP8 "
        f"linears{head}"
    )
    evidence = dict(eager_scaled_mm=eager, fp8_linears=n, head_blocks=head_blocks, at_most=2 * per_pass)
    eager_ok = per_pass <= eager <= 2 * per_pass
    if not on_gpu:
        detail = f"{eager} aten::_scaled_mm calls in one eager step (torch._scaled_mm's CPU kernel), {bounds}"
        return _check("fp8_gemms_launched", eager_ok, detail, **evidence)
    compiled, kernels = count_fp8_gemms(trainer)
    return _check(
        "fp8_gemms_launched",
        eager_ok and compiled == eager,
        f"{compiled} aten::_scaled_mm calls in one compiled step, {eager} in one eager step (equal expected), "
        f"{bounds}; kernels: {', '.join(kernels) or 'not attributed by the profiler'}",
        scaled_mm=compiled,
        kernels=kernels,
        **evidence,
    )


def _base_gradients_check(model: torch.nn.Module, with_grads: set[str]) -> Check:
    """A base weight with a gradient would mean a weight-gradient GEMM (and its memory) after all; an adapter without
    one, an adapter cut off from the loss."""
    adapters = {name for name, _ in model.named_parameters() if name.endswith(ADAPTER_NAMES)}
    base_with_grads = sorted(with_grads - adapters)
    adapters_without = sorted(adapters - with_grads)
    return _check(
        "no_base_weight_gradients",
        not base_with_grads and not adapters_without,
        f"{len(with_grads & adapters)} of {len(adapters)} adapter parameters got gradients, "
        f"{len(base_with_grads)} base parameters did" + (f" ({', '.join(base_with_grads)})" if base_with_grads else ""),
        base_with_gradients=base_with_grads,
        adapters_without_gradients=adapters_without,
    )


def _weight_casts_check(model: torch.nn.Module) -> Check:
    """Every FP8 base layer counts the casts of its weight (weight_casts): one, when built, however many steps ran."""
    casts = {name: m.weight_casts for name, m in model.named_modules() if hasattr(m, "weight_casts")}
    recast = {name: n for name, n in casts.items() if n != 1}
    return _check(
        "base_fp8_weights_cast_once",
        bool(casts) and not recast,
        f"{len(casts) - len(recast)} of {len(casts)} FP8 base weights cast once, after all the steps"
        + (f"; cast again: {', '.join(f'{k} ({v}x)' for k, v in recast.items())}" if recast else ""),
        layers=len(casts),
        recast=recast,
    )


def _lora_step_checks(built: Built, trainer: Trainer, batch, on_gpu: bool) -> list[Check]:
    """Check 2 and the two beside it, after training: the frozen base's GEMMs, gradients and weight casts."""
    eager, with_grads = _eager_step(built.model, batch)
    head_blocks = logits_row_blocks(batch[0].numel()) if built.lora.base.fused_loss_head else 0
    return [
        _lora_gemms_check(built.fp8_linears, head_blocks, eager, trainer, on_gpu),
        _base_gradients_check(built.model, with_grads),
        _weight_casts_check(built.model),
    ]


# ---- both ----


def _for_this_machine(config: RunConfig, on_gpu: bool) -> RunConfig:
    """On a GPU the config as asked: the runs are timed as train_h100.py would run them. On the CPU, without compile
    and with the FP8 that runs there."""
    if not on_gpu:
        # Compile would only add minutes here. Pretraining FP8 needs torchao's emulation (FP8 numerics without FP8
        # hardware); a LoRA base runs real FP8 GEMMs on the CPU, so its settings stay as asked.
        emulate = {} if config.finetune.lora else {"fp8_emulate": True}
        config = config.replace(fp8=emulate, train={"compile_model": False, "dtype": "bfloat16"})
    return config


PROFILED_TWIN_STEPS = 3  # compile, then warm steps: the profiled steps come after these


def _profiled_twin(timed: RunConfig, data: PreparedData, log, then: Callable[[Built, Trainer], Any], why: str) -> Any:
    """`then` of the timed run's model built again with its settings (every FP8 default as resolved for the timed run)
    but compiled without CUDA graphs, with the Python wrapper, and trained a few steps: its profiled steps show the
    ops that the timed run's step hides (`why`). Its memory is handed back before returning."""
    log(f"profiling a twin without CUDA graphs, with the Python wrapper ({why})")
    steps = PROFILED_TWIN_STEPS
    twin = {"compile_mode": "default", "compile_wrapper": PROFILED_WRAPPER, "max_steps": steps, "log_every": steps}
    twin_config = timed.replace(train=twin)
    twin = build(plan(twin_config))
    trainer, _ = train_for_measurement(twin, data.train, data.val, log=lambda message: None)
    after = then(twin, trainer)
    del trainer, twin
    release_memory()
    return after


def _linears_check(built: Built, log) -> Check:
    """Check 1: FP8 really is in the model (the build stage converts or builds the frozen base, then counts the FP8
    linears). A LoRA fine-tune logs its summary rows first: whose FP8, the base (and its hash), which layers are FP8,
    which carry adapters."""
    if not built.config.finetune.lora:
        return _converted_linears_check(built)
    for label, text in [("FP8", built.fp8_line), *built.finetune_rows]:
        log(f"{label}: {text}")
    return _lora_linears_check(built)


def _graph_breaks_check(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> Check:
    """Check 3: one graph, no breaks."""
    breaks, graphs = count_graph_breaks(model, batch)
    return _check(
        "no_graph_breaks", breaks == 0, f"{breaks} graph breaks, {graphs} graph(s)", breaks=breaks, graphs=graphs
    )


def _step_checks(built: Built, trainer: Trainer, batch, on_gpu: bool) -> list[Check]:
    """Check 2 (and for a LoRA fine-tune the two beside it) in a step of the trained, now warm, trainer."""
    if built.config.finetune.lora:
        return _lora_step_checks(built, trainer, batch, on_gpu)
    return [_converted_gemms_check(built, trainer, on_gpu)]


def _measure(
    built: Built,
    data: PreparedData,
    log,
    label: str,
    before: Callable[[Built], Any] = lambda built: None,
    evidence: Callable[[Built, Trainer], Any] | None = None,
) -> tuple[RunConfig, TrainResult, Any, Any]:
    """Train `built` as a measurement in its own compile mode: (its config, its result, `before(built)` taken before
    training, `evidence(built, trainer)` from more steps the profiler can see into). Those steps are the timed
    trainer's own, or where its step hides them from the profiler (CUDA graphs, the C++ wrapper) a twin's
    (_profiled_twin). The memory is handed back before returning: pass `built` without keeping it."""
    seen = before(built)
    log(f"training {label} ...")
    config = built.config
    trainer, result = train_for_measurement(built, data.train, data.val, log)
    hidden = hides_ops_from_profiler(config.train, built.device)
    after = evidence(built, trainer) if evidence is not None and hidden is None else None
    del trainer, built
    release_memory()
    if evidence is not None and hidden is not None:
        after = _profiled_twin(config, data, log, evidence, hidden)
    return config, result, seen, after


def _loss_check(fp8: TrainResult, bf16: TrainResult, loss_tolerance: float) -> Check:
    """Check 4: FP8's final loss within `loss_tolerance` (relative) of BF16's."""
    gap = abs(fp8.loss - bf16.loss) / bf16.loss
    return _check(
        "loss_matches_bf16",
        gap <= loss_tolerance,
        f"FP8 {fp8.loss:.4f} vs BF16 {bf16.loss:.4f} after {fp8.steps} steps: "
        f"{100 * gap:.2f}% apart (tolerance {100 * loss_tolerance:.1f}%)",
        fp8_loss=fp8.loss,
        bf16_loss=bf16.loss,
        relative_gap=gap,
    )


def _speedup_check(fp8: TrainResult, bf16: TrainResult, min_speedup: float, on_gpu: bool) -> Check:
    """Check 5: FP8 tokens/s over BF16 tokens/s; skipped on the CPU."""
    if on_gpu:
        speedup = fp8.tokens_per_sec / bf16.tokens_per_sec
        return _check(
            "fp8_speedup",
            speedup >= min_speedup,
            f"{speedup:.3f}x: FP8 {fp8.tokens_per_sec:,.0f} vs BF16 {bf16.tokens_per_sec:,.0f} "
            f"tokens/s (>= {min_speedup:.2f}x required); peak memory FP8 {fp8.peak_mem_gib:.1f} GiB, "
            f"BF16 {bf16.peak_mem_gib:.1f} GiB",
            speedup=speedup,
        )
    return Check("fp8_speedup", "SKIP", "needs a GPU: FP8 on CPU says nothing about speed")


def _diagnosis(config: RunConfig, on_gpu: bool, log) -> Diagnosis | None:
    """The doctor's findings that need no model (not for a LoRA fine-tune, whose base is not converted), printed
    before anything is planned: a refusal (no torchao, nothing to convert) then comes after its explanation. On the
    CPU compile is off for speed, not by the user's choice, so it is not a finding there."""
    if config.finetune.lora:
        return None
    diagnosis = diagnose_config(config, compile_model=config.train.compile_model is not False or not on_gpu)
    log(diagnosis.format())
    return diagnosis


def _gemm_shapes(built: Built) -> list[GemmShape]:
    """The GEMMs of one training step of `built`'s model, those of the linears its conversion converted marked."""
    converted = set(built.conversion.converted)
    c = built.config
    return linear_gemm_shapes(c.model, c.train.batch_size, lambda module, fqn: fqn in converted)


def _other_path(requested: RunConfig, chosen: RunConfig) -> Built | str:
    """This package's model built on the FP8 path not chosen (fused or TorchAO's), with that path's own defaults, so
    that the verification shows what each gives; or why there is none to compare (that path may refuse the settings,
    or convert nothing at this shape: the chosen path's verification goes on). `requested`: the config as asked, for
    this machine; `chosen`: the chosen path's, every setting resolved."""
    if chosen.model.hf_model is not None:
        return "a Hugging Face model takes TorchAO's path (or --fp8_path accelerate), not the fused one"
    if chosen.finetune.lora:
        return "a LoRA base runs this package's frozen FP8 linears whichever path is named"
    other = "torchao" if chosen.fp8.fp8_path != "torchao" else "fused"
    try:
        return build(plan(requested.replace(fp8={"fp8_path": other}).with_fp8(True)))
    except ConfigError as exc:
        return f"--fp8_path {other} cannot run here: {exc}"


def _timed_step(profile: StepBreakdown, result: TrainResult) -> StepBreakdown:
    """`profile` with the step time of the timed run it belongs to: the Amdahl row's measured ratio is then check 5's,
    in the runs' own compile modes (a twin's profiled steps ran without CUDA graphs)."""
    step_tokens = result.tokens / result.steps
    return dataclasses.replace(profile, step_ms=1e3 * step_tokens / result.tokens_per_sec, step_ms_samples=[])


def _path_line(config: RunConfig, result: TrainResult, summary: str, bf16: TrainResult, on_gpu: bool) -> str:
    """One FP8 path's line: what it converted, its loss, and on a GPU its tokens/s over BF16's."""
    speed = ""
    if on_gpu:
        speed = f", {result.tokens_per_sec:,.0f} tokens/s = {result.tokens_per_sec / bf16.tokens_per_sec:.3f}x BF16"
    path = LORA_FP8_PATH if config.finetune.lora else config.fp8.fp8_path  # a LoRA base's own, whatever --fp8_path
    return f"{path}: loss {result.loss:.4f}{speed}; {summary}"


def verify_fp8(
    config: RunConfig,
    loss_tolerance: float = LOSS_TOLERANCE,
    min_speedup: float = MIN_SPEEDUP,
    log=print,
    compare_paths: bool = True,
) -> Verification:
    """Run the checks for `config`'s model and batch (a LoRA fine-tune's for one), and the doctor's findings. On CPU
    checks 1-4 run: pretraining FP8 emulated, a LoRA fine-tune's frozen FP8 base on torch._scaled_mm's CPU kernels.
    On a GPU each precision is timed in the compile mode its run would use, and the Amdahl row is added: X from a
    profiled BF16 step, s from the GEMMs timed alone, set beside the measured ratio. `compare_paths`: for this
    package's model, train the FP8 path not chosen too and show both side by side."""
    on_gpu = resolve_device(config.train.device).type == "cuda"
    requested = _for_this_machine(config, on_gpu)
    if not on_gpu:
        fp8 = "the frozen base's FP8 on torch._scaled_mm's CPU kernel" if config.finetune.lora else "FP8 emulated"
        log(f"on the CPU: uncompiled, BF16 weights, {fp8}, whatever the flags ask (a numerics check, not a timing)")
    diagnosis = _diagnosis(requested, on_gpu, log)
    # the same checks as train_h100.py: FP8 support, batch shape, attention
    fp8_plan = plan(requested.with_fp8(True))
    config, device = fp8_plan.config, fp8_plan.device
    log(fp8_plan.fp8_support.format())
    data = prepare_data(config.data, config.model.vocab_size)
    require_windows(len(data.train), config.model.context_length, "the training data")
    rng = np.random.default_rng(config.train.seed)
    batch = get_batch(data.train, config.train.batch_size, config.model.context_length, device, rng)
    # The Amdahl row's profiles of warm steps, on a GPU (a LoRA base has no weight-gradient GEMMs: not this model).
    amdahl = on_gpu and not config.finetune.lora

    def before_training(built: Built):
        # Check 3 before training, so that a break is reported even if compile would then fail.
        return _linears_check(built, log), _graph_breaks_check(built.model, batch), built.conversion, built.fp8_line

    def fp8_evidence(built: Built, trainer: Trainer):
        # Check 2 in a warm training step, after the training (a LoRA base's weight casts counted across it); the
        # converted GEMMs' shapes, which the BF16 profile is read by too.
        shapes = _gemm_shapes(built) if amdahl else []
        profile = profile_step_breakdown(trainer, shapes) if amdahl else None
        return _step_checks(built, trainer, batch, on_gpu), profile, shapes

    # Checks 4 + 5 compare the same steps, seed and data in both precisions; FP8 first is as fair as BF16 first (both
    # warm up). Each run is built, measured and freed before the next, so that each peak memory is its own.
    _, fp8_result, checked, (step_checks, fp8_profile, shapes) = _measure(
        build(fp8_plan), data, log, "FP8", before_training, fp8_evidence
    )
    linears, graph_breaks, conversion, fp8_line = checked
    other = _other_path(requested, config) if compare_paths else None
    other_run = None
    if isinstance(other, Built):
        label = f"FP8 on the other path, --fp8_path {other.config.fp8.fp8_path}"
        other_config, other_result, other_line, _ = _measure(other, data, log, label, lambda built: built.fp8_line)
        other_run = (other_config, other_result)
        del other
        release_memory()

    def bf16_evidence(built: Built, trainer: Trainer):
        return profile_step_breakdown(trainer, shapes), built.config.train.compile_mode  # the profiled step's mode

    bf16_config, bf16_result, _, bf16_profiled = _measure(
        build(fp8_plan.with_fp8(False)), data, log, "BF16", evidence=bf16_evidence if amdahl else None
    )
    paths = [_path_line(config, fp8_result, fp8_line, bf16_result, on_gpu)]
    if other_run is not None:
        paths.append(_path_line(*other_run, other_line, bf16_result, on_gpu))
    elif isinstance(other, str):
        paths.append(f"not compared: {other}")
    row = None
    if amdahl:
        log(f"timing the {len(shapes)} distinct GEMMs alone, BF16 and FP8 ...")
        timings = time_matmuls(shapes, device, config.fp8.fp8_recipe)
        bf16_profile, profiled_mode = bf16_profiled  # both profiles were taken without CUDA graphs, in this mode
        profiled = config.replace(train={"compile_mode": profiled_mode})
        bf16_profile, fp8_profile = _timed_step(bf16_profile, bf16_result), _timed_step(fp8_profile, fp8_result)
        row = amdahl_row(profiled, device, bf16_profile, fp8_profile, conversion, timings, notes=[])
    if diagnosis is not None and on_gpu:  # speed and memory on the CPU say nothing about a GPU's
        diagnosis.findings += measured_findings(
            fp8_result, bf16_result, row, config.train.compile_model, bool(config.fp8.fp8_shape_filter)
        )

    # Listed by number (1, 2 with a LoRA fine-tune's two beside it, 3, 4, 5), not in the order they ran.
    checks = [
        linears,
        *step_checks,
        graph_breaks,
        _loss_check(fp8_result, bf16_result, loss_tolerance),
        _speedup_check(fp8_result, bf16_result, min_speedup, on_gpu),
    ]
    measured = [(bf16_config, bf16_result), (config, fp8_result), *([other_run] if other_run else [])]
    runs = [result_record(c, r) for c, r in measured]
    support = fp8_plan.fp8_support.format()
    return Verification(checks, runs, support, diagnosis=diagnosis, amdahl=row, paths=paths)
