"""The FP8 doctor's findings: why FP8 is (or would be) as fast as it is on a model, each backed by a number.

Two kinds. Before anything is timed (`diagnose`, `diagnose_config`: any model, this package's or a Hugging Face
one, no GPU needed): what each conversion policy would convert and how much of the step that can be. After the
verification has trained both precisions (`measured_findings`): what the measured runs and the Amdahl row (X, the
converted GEMMs' share of the BF16 step; s, their FP8 speedup alone) say, e.g. FP8 slower than BF16, casts costing
more than the GEMMs save, more memory than BF16.

For three conversion policies, which linears convert and why the rest do not:
  accelerate    Accelerate's TorchAO backend with its default filter (`Accelerator(mixed_precision="fp8")` and
                `AORecipeKwargs()`): every nn.Linear with both dims divisible by 16 but the model's first and last
                (accelerate/utils/ao.py: `filter_linear_layers`, `find_first_last_linear_layers`). The first is
                found in module order, so in a Hugging Face decoder it is block 0's q_proj, not an input layer.
  shape-rule    TorchAO's path as this package runs it with its shape rule (`--fp8_path torchao`): the lm_head in
                BF16, and only layers large enough for tensorwise FP8 to pay by TorchAO's own H100 thresholds.
  every-linear  every nn.Linear whose dims FP8 GEMMs take, the lm_head included.

Then, from the GEMM shapes of one training step at the given tokens per micro-batch, the share of the step's
matmul FLOPs that each policy puts in FP8, and the best speedup that share allows if FP8 GEMMs ran at the dense
FP8 peak, twice BF16's on Hopper (Amdahl's law over FLOPs: an upper bound, since the step also spends time outside
its GEMMs and casts cost time). Each finding names the number it rests on and what to do about it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from torch import nn

from cs336_basics.config import FP8Config, RunConfig
from cs336_basics.diagnostics.amdahl.law import amdahl_prediction, gemm_shapes, model_skeleton
from cs336_basics.diagnostics.amdahl.report import AmdahlRow
from cs336_basics.precision.accelerate import accelerate_skip_rule, first_and_last_linear
from cs336_basics.precision.rules import (
    SKIP_NOT_16,
    SKIP_SMALL,
    FP8ConversionReport,
    file_decisions,
    fp8_gemm_dims,
    fp8_gemm_pays,
    is_linear,
    skip_rule,
)
from cs336_basics.precision.support import TORCHAO_INSTALL_HINT, torchao_version
from cs336_basics.training.metrics import attention_flops_per_token

if TYPE_CHECKING:
    from cs336_basics.training.trainer import TrainResult

POLICIES = ("accelerate", "shape-rule", "every-linear")
FP8_PEAK_OVER_BF16 = 2.0  # dense FP8 over dense BF16 tensor-core peak on H100/H200 (1979 vs 989 TFLOP/s)
# A policy whose FP8 GEMMs hold less than this share of the step's matmul FLOPs cannot pay for its casts: even at
# the FP8 peak the step would gain under ~11%.
LOW_SHARE = 0.2


@dataclass
class Finding:
    """One thing the doctor found: what (`cause`), the number behind it (`measured`), and what to do (`advice`)."""

    cause: str
    measured: str
    advice: str
    problem: bool = True  # False: a note that needs no action


@dataclass
class PolicyShare:
    policy: str
    report: FP8ConversionReport
    fp8_flop_share: float  # converted GEMM FLOPs over all matmul FLOPs of a training step
    flop_bound_speedup: float  # amdahl_prediction(share, FP8_PEAK_OVER_BF16)


@dataclass
class Diagnosis:
    tokens: int  # per micro-batch
    torchao: str | None  # its version, None when it does not import
    policies: list[PolicyShare]
    findings: list[Finding] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "torchao": self.torchao,
            "policies": [
                {"policy": p.policy, "converted": p.report.n_converted, "linears": p.report.n_linear,
                 "skipped": p.report.skipped, "fp8_flop_share": p.fp8_flop_share,
                 "flop_bound_speedup": p.flop_bound_speedup}
                for p in self.policies
            ],
            "findings": [asdict(f) for f in self.findings],
        }  # fmt: skip

    def format(self) -> str:
        lines = [f"FP8 conversion policies ({self.tokens:,} tokens per micro-batch):"]
        for p in self.policies:
            lines.append(
                f"  {p.policy:<12}  {p.report.n_converted:>4} of {p.report.n_linear} linears, "
                f"{100 * p.fp8_flop_share:.0f}% of matmul FLOPs in FP8, at most {p.flop_bound_speedup:.2f}x"
            )
        lines.append("findings:" if self.findings else "findings: none")
        for f in self.findings:
            lines.append(f"  {'!' if f.problem else '-'} {f.cause}: {f.measured}. {f.advice}")
        return "\n".join(lines)


def _policy_skip(policy: str, model: nn.Module) -> Callable[[nn.Module, str], tuple[str, str] | None]:
    if policy == "accelerate":
        return accelerate_skip_rule(model)
    if policy == "shape-rule":
        return skip_rule(FP8Config(use_fp8=True, fp8_shape_filter=True, fp8_lm_head=False))
    if policy == "every-linear":
        return skip_rule(FP8Config(use_fp8=True, fp8_shape_filter=False, fp8_lm_head=True))
    raise ValueError(f"unknown policy {policy!r}; one of {POLICIES}")


def policy_report(model: nn.Module, policy: str) -> FP8ConversionReport:
    """Which of the model's linears `policy` converts (tensorwise) and why it skips the others."""
    report = FP8ConversionReport(recipe="tensorwise", format="E4M3 forward / E5M2 gradients", emulate=False)
    file_decisions(model, _policy_skip(policy, model), report)
    return report


def _linears(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(fqn, m) for fqn, m in model.named_modules(remove_duplicate=False) if is_linear(m, fqn)]


def policy_share(model: nn.Module, policy: str, tokens: int, other_flops: float) -> PolicyShare:
    """`policy`'s report and the share of the step's matmul FLOPs (linears + `other_flops`) its FP8 GEMMs hold."""
    report = policy_report(model, policy)
    converted = set(report.converted)
    shapes = gemm_shapes(_linears(model), tokens, lambda m, fqn: fqn in converted)
    total = sum(s.flops * s.count for s in shapes) + other_flops
    share = sum(s.flops * s.count for s in shapes if s.converted) / total if total else 0.0
    return PolicyShare(policy, report, share, amdahl_prediction(share, FP8_PEAK_OVER_BF16))


def _findings(model: nn.Module, tokens: int, torchao: str | None, torchao_error: str, shares: list[PolicyShare],
              compile_model: bool) -> list[Finding]:  # fmt: skip
    found = []
    if torchao is None:
        found.append(Finding("FP8 backend missing", f"torchao does not import ({torchao_error})",
                             f"Accelerate's FP8 needs it too: {TORCHAO_INSTALL_HINT}."))  # fmt: skip
    if not compile_model:
        found.append(Finding(
            "FP8 without torch.compile",
            "compile is off, so every cast, amax and scale runs as its own eager kernel around each GEMM",
            "Compile the model after conversion (torch.compile(model), or Accelerate's dynamo_backend='inductor').",
        ))  # fmt: skip
    by_policy = {p.policy: p for p in shares}
    for p in shares:
        if p.report.n_converted == 0:
            found.append(
                Finding(
                    f"{p.policy}: no layer converted",
                    f"0 of {p.report.n_linear} linears ({p.report.summary_line()})",
                    "FP8 would change nothing here: see the reasons.",
                )
            )
    not_16 = [fqn for fqn, cat in by_policy["every-linear"].report.skip_category.items() if cat == SKIP_NOT_16]
    if not_16:
        found.append(Finding(
            "dimensions FP8 GEMMs cannot take", f"{len(not_16)} linears have a dim not divisible by 16 "
            f"(e.g. {not_16[0]})", "Pad those dims (e.g. the vocabulary) to a multiple of 16 to convert them.",
        ))  # fmt: skip
    if not fp8_gemm_dims(tokens):
        found.append(
            Finding(
                "tokens per micro-batch not a multiple of 16",
                f"{tokens} tokens",
                "The FP8 grad_weight GEMM needs it: change the batch size or the sequence length.",
            )
        )
    linears = [m for _, m in _linears(model)]
    small = [m for m in linears if fp8_gemm_dims(m.in_features, m.out_features)
             and not fp8_gemm_pays(m.out_features, m.in_features, "tensorwise")]  # fmt: skip
    if small:
        found.append(Finding(
            "layers too small for tensorwise FP8", f"{len(small)} of {len(linears)} linears are under TorchAO's "
            f"tensorwise thresholds ({SKIP_SMALL.split(':')[0]}; e.g. {small[0].out_features} x "
            f"{small[0].in_features})", "Expect the casts to cost about what their FP8 GEMMs save; a wider model "
            "or more tokens per micro-batch is where FP8 pays.",
        ))  # fmt: skip
    best = max(shares, key=lambda p: p.fp8_flop_share)
    if best.fp8_flop_share < LOW_SHARE:
        found.append(Finding(
            "too little of the step in FP8 GEMMs", f"at most {100 * best.fp8_flop_share:.0f}% of the matmul FLOPs "
            f"({best.policy}), so at most {best.flop_bound_speedup:.2f}x at the FP8 peak",
            "This model is too small for FP8 to pay: train it in BF16.",
        ))  # fmt: skip
    accelerate = by_policy["accelerate"]
    found.append(Finding(
        "Accelerate's default filter", f"{accelerate.report.n_converted} of {accelerate.report.n_linear} linears; "
        f"kept in BF16: {', '.join(first_and_last_linear(model))}",
        f"It keeps the first and last nn.Linear in module order in BF16; every-linear would put "
        f"{100 * by_policy['every-linear'].fp8_flop_share:.0f}% of the FLOPs in FP8 against its "
        f"{100 * accelerate.fp8_flop_share:.0f}%.", problem=False,
    ))  # fmt: skip
    return found


def diagnose(model: nn.Module, tokens: int, n_layers: int, dim: int, seq_len: int,
             compile_model: bool = True) -> Diagnosis:  # fmt: skip
    """The doctor's findings for `model` (any module built from nn.Linear layers) trained on `tokens` tokens per
    micro-batch of sequences `seq_len` long, attention with `n_layers` layers of width `dim`."""
    version, error = torchao_version()
    other = attention_flops_per_token(n_layers, dim, seq_len) * tokens
    shares = [policy_share(model, policy, tokens, other) for policy in POLICIES]
    return Diagnosis(tokens, version, shares, _findings(model, tokens, version, error, shares, compile_model))


def diagnose_config(config: RunConfig, compile_model: bool = True) -> Diagnosis:
    """diagnose() for the model and micro-batch `config` describes (this package's model or a Hugging Face one, built
    as a skeleton: nothing allocated), before anything is built for real."""
    m = config.model
    tokens = config.train.batch_size * m.context_length
    return diagnose(model_skeleton(m), tokens, m.n_layers, m.dim, m.context_length, compile_model)


# ---- what the measured step says ----

# The measured thresholds at which a finding is reported: FP8 this much slower than its GEMMs promise, or this much
# more memory than BF16, is worth a line.
SHORTFALL = 0.9  # measured speedup under this fraction of the Amdahl prediction
MORE_MEMORY = 1.05  # FP8 peak over BF16 peak


def measured_findings(fp8: TrainResult, bf16: TrainResult, row: AmdahlRow | None, compiled: bool,
                      shape_filter: bool = False) -> list[Finding]:  # fmt: skip
    """What the two measured runs (and, on a GPU, the Amdahl row: X from the BF16 profile, s from the GEMM
    microbenchmark) say about why FP8 is as fast as it is, each with its number. `compiled`, `shape_filter`: the FP8
    run's settings, which decide the advice."""
    found = []
    ratio = fp8.tokens_per_sec / bf16.tokens_per_sec if fp8.tokens_per_sec and bf16.tokens_per_sec else None
    how = "compiled" if compiled else "eager (no torch.compile)"
    if ratio is not None and ratio < 1.0:
        found.append(Finding(
            "FP8 slower than BF16", f"{ratio:.3f}x ({fp8.tokens_per_sec:,.0f} vs {bf16.tokens_per_sec:,.0f} tokens/s, "
            f"{how})", "The findings below say where the time goes; without one, FP8 does not pay at this shape.",
        ))  # fmt: skip
    if row is not None:
        x, s = row.linear_share, row.matmul_speedup
        if row.measured_speedup < SHORTFALL * row.predicted_speedup:
            found.append(Finding(
                "FP8 costs more than its GEMMs save", f"predicted {row.predicted_speedup:.3f}x from X = {100 * x:.0f}% "
                f"of the BF16 step in the converted GEMMs at s = {s:.2f}x, measured {row.measured_speedup:.3f}x: "
                f"{row.cast_overhead_ms:+.2f} ms per step of casts and scaling over the prediction",
                ("Compile the model (casts fuse into the surrounding kernels) and feed more tokens per micro-batch, "
                 "so each cast is amortised over a larger GEMM." if not compiled else "More tokens per micro-batch "
                 "amortise each cast over a larger GEMM.")
                + ("" if shape_filter else " --fp8_shape_filter keeps the layers too small to pay in BF16."),
            ))  # fmt: skip
        if x < LOW_SHARE:
            found.append(Finding(
                "little of the step in converted GEMMs", f"X = {100 * x:.0f}% of the BF16 step, so at most "
                f"{amdahl_prediction(x, s):.3f}x even with free casts (s = {s:.2f}x)",
                "Attention, norms and the optimizer hold the rest: FP8 cannot pay much here; a wider model does.",
            ))  # fmt: skip
    if fp8.peak_mem_gib and bf16.peak_mem_gib and fp8.peak_mem_gib > MORE_MEMORY * bf16.peak_mem_gib:
        found.append(Finding(
            "FP8 uses more memory than BF16", f"peak {fp8.peak_mem_gib:.2f} vs {bf16.peak_mem_gib:.2f} GiB "
            f"({fp8.peak_mem_gib / bf16.peak_mem_gib:.2f}x, {how})",
            "Eager FP8 keeps each BF16 input and its FP8 copy alive for backward: compile the model." if not compiled
            else "The FP8 copies saved for backward add to BF16's activations; a smaller micro-batch with gradient "
            "accumulation lowers the peak.",
        ))  # fmt: skip
    return found
