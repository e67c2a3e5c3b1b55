"""Prove, on this machine, that FP8 is really applied and really pays.

Five checks, each PASS / FAIL / SKIP with the evidence:
  1. fp8_linears         FP8 linears are in the model (TorchAO's Float8Linear, or the fused path's), as many as the
                         conversion promised.
  2. fp8_gemms_launched  the profiler sees FP8 matmuls (aten::_scaled_mm) in one compiled training step: one per
                         FP8 linear per GEMM (forward, grad_input, grad_weight). With emulation (CPU) it counts the FP8
                         casts instead, since emulated matmuls run in high precision.
  3. no_graph_breaks     dynamo traces the FP8 model's forward (and loss) as one graph.
  4. loss_matches_bf16   after the same steps from the same seed and data, FP8 loss is within a tolerance of BF16.
  5. fp8_speedup         FP8 + compile tokens/s over BF16 + compile tokens/s, measured in this process (GPU only).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from cs336_basics.build import build, plan, resolve_device
from cs336_basics.config import RunConfig
from cs336_basics.data import get_batch, prepare_data, require_windows
from cs336_basics.precision.fp8 import grad_weight_in_fp8
from cs336_basics.results import result_record
from cs336_basics.training.measure import release_memory, train_for_measurement
from cs336_basics.training.trainer import Trainer

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


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

    @property
    def passed(self) -> bool:
        return all(c.status != "FAIL" for c in self.checks)

    def table(self) -> str:
        width = max(len(c.name) for c in self.checks)
        lines = [f"{'check':<{width}}  result  evidence", f"{'-' * width}  ------  --------"]
        lines += [f"{c.name:<{width}}  {c.status:<6}  {c.detail}" for c in self.checks]
        return "\n".join(lines)


def _check(name: str, ok: bool, detail: str, **evidence: Any) -> Check:
    return Check(name, "PASS" if ok else "FAIL", detail, evidence)


class _Float8CastCounter(TorchDispatchMode):
    """Counts ATen ops that produce FP8 tensors: under emulation these casts are where FP8 numerics happen."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if any(isinstance(t, torch.Tensor) and t.dtype in FP8_DTYPES for t in tree_leaves(out)):
            self.count += 1
        return out


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


def verify_fp8(config: RunConfig, loss_tolerance: float = 0.02, min_speedup: float = 1.0, log=print) -> Verification:
    """Run the five checks for `config`'s model and batch. On CPU FP8 is emulated and checks 1-4 run."""
    on_gpu = resolve_device(config.train.device).type == "cuda"
    if not on_gpu:  # torchao's emulation: FP8 numerics without FP8 hardware; compile would only add minutes here
        config = config.replace(fp8={"fp8_emulate": True}, train={"compile_model": False, "dtype": "bfloat16"})
    fp8_plan = plan(config.with_fp8(True))  # the same checks as train_h100.py: FP8 support, batch shape, attention
    config, device = fp8_plan.config, fp8_plan.device
    log(fp8_plan.fp8_support.format())
    data = prepare_data(config.data, config.model.vocab_size)
    require_windows(len(data.train), config.model.context_length, "the training data")
    checks: list[Check] = []

    # 1. conversion really happened (the build stage converts, then counts the FP8 linears itself)
    built = build(fp8_plan)
    model, report = built.model, built.conversion
    checks.append(
        _check(
            "fp8_linears",
            built.fp8_linears == report.n_converted > 0,
            f"{built.fp8_linears} FP8 linears counted, {report.n_converted} expected ({report.summary_line()})",
            counted=built.fp8_linears,
            expected=report.n_converted,
            skipped=report.skipped,
        )
    )

    # 3. one graph, no breaks (before training so a break is reported even if compile would then fail)
    rng = np.random.default_rng(config.train.seed)
    batch = get_batch(data.train, config.train.batch_size, config.model.context_length, device, rng)
    breaks, graphs = count_graph_breaks(model, batch)
    checks.append(
        _check(
            "no_graph_breaks", breaks == 0, f"{breaks} graph breaks, {graphs} graph(s)", breaks=breaks, graphs=graphs
        )
    )

    # 4 + 5. the same steps, seed and data in both precisions; FP8 first is as fair as BF16 first (both warm up)
    log("training FP8 ...")
    fp8_trainer, fp8_result = train_for_measurement(model, config, data.train, data.val, device, log)

    # 2. FP8 GEMMs in a (now warm) compiled training step
    expected_gemms = report.n_converted * _gemms_per_linear(config.fp8.fp8_recipe)
    if on_gpu:
        scaled_mm, kernels = count_fp8_gemms(fp8_trainer)
        checks.insert(
            1,
            _check(
                "fp8_gemms_launched",
                scaled_mm >= expected_gemms,
                f"{scaled_mm} aten::_scaled_mm calls in one compiled step, >= {expected_gemms} expected "
                f"({report.n_converted} linears x {_gemms_per_linear(config.fp8.fp8_recipe)} GEMMs); "
                f"kernels: {', '.join(kernels) or 'not attributed by the profiler'}",
                scaled_mm=scaled_mm,
                kernels=kernels,
                expected=expected_gemms,
            ),
        )
    else:
        counter = _Float8CastCounter()
        with counter:
            fp8_trainer.train_step()
        expected_casts = 2 * report.n_converted  # at least input and weight per linear per forward
        checks.insert(
            1,
            _check(
                "fp8_gemms_launched",
                counter.count >= expected_casts,
                f"emulated: {counter.count} FP8 casts in one eager step, >= {expected_casts} expected "
                "(real FP8 GEMMs need a GPU)",
                fp8_casts=counter.count,
                expected=expected_casts,
            ),
        )
    # Free the FP8 run before the BF16 one so BF16's peak memory is its own.
    del fp8_trainer, model
    release_memory()

    log("training BF16 ...")
    bf16 = build(fp8_plan.with_fp8(False))  # the twin: same seed, same initial weights
    bf16_config, bf16_model = bf16.config, bf16.model
    bf16_trainer, bf16_result = train_for_measurement(bf16_model, bf16_config, data.train, data.val, device, log)
    del bf16_trainer, bf16_model
    release_memory()

    gap = abs(fp8_result.loss - bf16_result.loss) / bf16_result.loss
    checks.append(
        _check(
            "loss_matches_bf16",
            gap <= loss_tolerance,
            f"FP8 {fp8_result.loss:.4f} vs BF16 {bf16_result.loss:.4f} after {fp8_result.steps} steps: "
            f"{100 * gap:.2f}% apart (tolerance {100 * loss_tolerance:.1f}%)",
            fp8_loss=fp8_result.loss,
            bf16_loss=bf16_result.loss,
            relative_gap=gap,
        )
    )
    if on_gpu:
        speedup = fp8_result.tokens_per_sec / bf16_result.tokens_per_sec
        checks.append(
            _check(
                "fp8_speedup",
                speedup >= min_speedup,
                f"{speedup:.3f}x: FP8 {fp8_result.tokens_per_sec:,.0f} vs BF16 {bf16_result.tokens_per_sec:,.0f} "
                f"tokens/s (>= {min_speedup:.2f}x required); peak memory FP8 {fp8_result.peak_mem_gib:.1f} GiB, "
                f"BF16 {bf16_result.peak_mem_gib:.1f} GiB",
                speedup=speedup,
            )
        )
    else:
        checks.append(Check("fp8_speedup", "SKIP", "needs a GPU: emulated FP8 on CPU says nothing about speed"))

    runs = [result_record(c, r) for c, r in ((bf16_config, bf16_result), (config, fp8_result))]
    return Verification(checks=checks, runs=runs, support=fp8_plan.fp8_support.format())
