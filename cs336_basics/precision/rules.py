"""The rules every FP8 implementation of this package shares (TorchAO's path, Accelerate's, the fused path, a LoRA
fine-tune's frozen base), so that each converts the same linears for the same reasons and reports them alike:
- the filters: which nn.Linear layers convert, and for the rest the reason (the lm_head, GEMM dims not divisible by
  16, torchao's shape threshold), as one `(module, fqn) -> bool` or as a reason per layer;
- the conversion report (FP8ConversionReport): converted and skipped layers with their reasons, one summary line;
- the checks around a conversion: the model ready for it (uncompiled, BF16 on its device), nothing converted is an
  error that says how to convert something, the state-dict keys unchanged by it (BF16 and FP8 checkpoints load into
  each other), and the micro-batch's token count an FP8 backward can take.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from cs336_basics.compiled import compiled_submodules
from cs336_basics.config import FP8Config
from cs336_basics.errors import ConfigError

ModuleFilter = Callable[[nn.Module, str], bool]

ORDER = "create model -> move to CUDA + BF16 -> convert to FP8 -> torch.compile"

# Skip categories: the summary line groups skipped layers by these, the per-layer reason adds detail.
SKIP_LM_HEAD = "output projection: --fp8_lm_head to convert"
SKIP_NOT_16 = "dims not divisible by 16"
SKIP_SMALL = "below the shape threshold: --no_fp8_shape_filter to convert"


# ---- which layers to convert ----


def fp8_gemm_pays(out_features: int, in_features: int, recipe: str) -> bool:
    """Whether a linear layer's GEMM is large enough for FP8 to beat BF16 on an H100, by torchao's rule.

    With N = out_features and K = in_features (torchao's `N, K = weight.shape`), skip when:
      tensorwise:                   K <= 4096 and N <= 1024
      rowwise, rowwise_with_gw_hp:  N <= 2048, or K <= 1024, or (N <= 4096 and K <= 2048)

    The thresholds are torchao's own (torchao/float8/float8_linear_utils.py: `_auto_filter_for_tensorwise`
    and `_auto_filter_for_rowwise`, torchao 0.18), derived from the H100 microbenchmark tables in torchao's
    float8 README (https://github.com/pytorch/ao/tree/main/torchao/float8#performance), which time a whole
    linear fwd+bwd including the casts at large token counts. Below them the cast/scale overhead eats the
    faster GEMM. torchao has no auto filter for rowwise_with_gw_hp; we use the rowwise thresholds for it,
    since it runs the same rowwise kernels for its forward and grad_input GEMMs (and its grad_weight GEMM
    is in high precision, so it gains even less). They were measured on H100s only.
    """
    n, k = out_features, in_features
    if recipe == "tensorwise":
        return not (k <= 4096 and n <= 1024)
    if recipe in ("rowwise", "rowwise_with_gw_hp"):
        return not (n <= 2048 or k <= 1024 or (n <= 4096 and k <= 2048))
    raise ValueError(f"unknown FP8 recipe {recipe!r}")


def is_linear(module: nn.Module, fqn: str) -> bool:
    return isinstance(module, nn.Linear)


def fp8_gemm_dims(*dims: int) -> bool:
    """Whether an FP8 GEMM (torch._scaled_mm / cuBLASLt) can take these matrix dimensions: multiples of 16."""
    return all(d % 16 == 0 for d in dims)


def dims_divisible_by_16(module: nn.Module, fqn: str) -> bool:
    # Both of the weight's dims are GEMM dims in one of its three GEMMs.
    return fp8_gemm_dims(module.in_features, module.out_features)


def is_lm_head(module: nn.Module, fqn: str) -> bool:
    return fqn.rsplit(".", 1)[-1] == "lm_head"


@dataclass(frozen=True)
class _Rule:
    keep: ModuleFilter
    category: str  # groups skips in the summary
    detail: Callable[[nn.Module], str]  # the per-layer specifics


def _rules(cfg: FP8Config) -> list[_Rule]:
    """The filters in cfg, in the order their reasons are reported (the first failing rule is the reason)."""
    rules = []
    if not cfg.fp8_lm_head:
        rules.append(_Rule(lambda m, f: not is_lm_head(m, f), SKIP_LM_HEAD, lambda m: ""))
    dims = lambda m: f"in_features={m.in_features}, out_features={m.out_features}"
    rules.append(_Rule(dims_divisible_by_16, SKIP_NOT_16, dims))
    if cfg.fp8_shape_filter:
        recipe = cfg.fp8_recipe

        def pays(module: nn.Module, fqn: str) -> bool:
            return fp8_gemm_pays(module.out_features, module.in_features, recipe)

        threshold = (
            "in_features > 4096 or out_features > 1024"
            if recipe == "tensorwise"
            else "out_features > 2048 and in_features > 1024, and not both out <= 4096 and in <= 2048"
        )
        rules.append(
            _Rule(
                pays,
                SKIP_SMALL,
                lambda m: (
                    f"out_features={m.out_features}, in_features={m.in_features}; "
                    f"{recipe} FP8 pays on an H100 only if {threshold}"
                ),
            )
        )
    return rules


def _skip(rules: list[_Rule], module: nn.Module, fqn: str) -> tuple[str, str] | None:
    """(category, full reason) for the first rule that rejects the module, or None to convert it."""
    if not is_linear(module, fqn):
        return "not an nn.Linear", "not an nn.Linear"
    for rule in rules:
        if not rule.keep(module, fqn):
            detail = rule.detail(module)
            return rule.category, f"{rule.category} ({detail})" if detail else rule.category
    return None


def skip_rule(cfg: FP8Config) -> Callable[[nn.Module, str], tuple[str, str] | None]:
    """cfg's filters as one function: (category, full reason) for a module they would not convert, else None."""
    rules = _rules(cfg)
    return lambda module, fqn: _skip(rules, module, fqn)


def module_filter(cfg: FP8Config) -> ModuleFilter:
    """All of cfg's filters composed into the one `(module, fqn) -> bool` torchao's module_filter_fn takes."""
    skip = skip_rule(cfg)
    return lambda module, fqn: skip(module, fqn) is None


def skip_reason(module: nn.Module, fqn: str, cfg: FP8Config) -> str | None:
    """Why cfg's filters would not convert this module, or None if they would."""
    result = skip_rule(cfg)(module, fqn)
    return None if result is None else result[1]


def grad_weight_in_fp8(recipe: str) -> bool:
    """Whether `recipe` runs backward's grad_weight GEMM in FP8: all do but rowwise_with_gw_hp, which keeps it in
    high precision. The forward and grad_input GEMMs are FP8 in every recipe."""
    return recipe != "rowwise_with_gw_hp"


def check_fp8_tokens(batch_size: int, seq_len: int, cfg: FP8Config) -> None:
    """Raise ConfigError if a training micro-batch of batch_size x seq_len tokens cannot run FP8 backward.

    In backward, grad_weight = grad_output^T @ input has the token count as its inner (K) dimension, and
    torch._scaled_mm needs K % 16 == 0 (seen on torch 2.11 / H200: tensorwise and rowwise fail with 20 tokens,
    eager and compiled). rowwise_with_gw_hp computes grad_weight in high precision and emulation uses plain
    matmuls, so neither has the limit. Forward-only passes (eval, generation) never have it.
    """
    if not cfg.use_fp8 or cfg.fp8_emulate or not grad_weight_in_fp8(cfg.fp8_recipe):
        return
    tokens = batch_size * seq_len
    if not fp8_gemm_dims(tokens):
        raise ConfigError(
            f"FP8 training with --fp8_recipe {cfg.fp8_recipe} needs the tokens per micro-batch to be a multiple of "
            f"16 (batch_size {batch_size} x sequence length {seq_len} = {tokens}): in backward the token count is the "
            "inner dimension of the FP8 grad_weight GEMM. Change batch_size or context_length, or use "
            "--fp8_recipe rowwise_with_gw_hp (grad_weight in high precision)."
        )


# ---- the conversion, whichever implementation runs it ----


# How the summaries name --fp8_fast_accum_backward, which the lm_head does not take (fused/units.py says why).
FAST_ACCUM_BACKWARD_NOTE = "fast backward accumulation (not the lm_head's)"


@dataclass
class FP8ConversionReport:
    recipe: str
    format: str  # e.g. "E4M3 forward / E5M2 gradients", read back from torchao's config
    emulate: bool
    converted: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # fqn -> reason
    skip_category: dict[str, str] = field(default_factory=dict)  # fqn -> category, for grouping
    format_short: str = ""
    path: str = "torchao"  # which FP8 implementation converted the model (FP8Config.fp8_path)
    scaling: str = "dynamic"
    fast_accum_backward: bool = False  # --fp8_fast_accum_backward (fused path)
    shared_input_groups: int = 0  # groups of converted linears that share one cast of their input (fused path)
    fused_swiglu_blocks: int = 0  # SwiGLU blocks run as one FP8 unit (fused path)
    fused_rope_groups: int = 0  # of the shared_input_groups, attention's q/k/v with RoPE as one unit (fused path)
    producers: str = ""  # what writes those blocks' FP8 activations: Triton kernels or the torch reference
    fused_loss_head: bool = False  # the lm_head computes the loss and casts the logits' gradient itself (fused path)

    @property
    def n_converted(self) -> int:
        return len(self.converted)

    @property
    def n_linear(self) -> int:
        return len(self.converted) + len(self.skipped)

    def summary_line(self) -> str:
        """One line, e.g. "tensorwise, E4M3 fwd / E5M2 grad: 48 of 169 linears converted; skipped: ..."."""
        head = f"{self.recipe}{' (emulated)' if self.emulate else ''}, {self.format_short or self.format}"
        if self.path != "torchao":
            head = f"{self.path} path, {self.scaling} scaling, {head}"
            if self.fast_accum_backward:
                head += f", {FAST_ACCUM_BACKWARD_NOTE}"
        line = f"{head}: {self.n_converted} of {self.n_linear} linears converted"
        if self.shared_input_groups:
            line += f" ({self.shared_input_groups} groups share an input cast"
            line += f", {self.fused_rope_groups} with RoPE fused)" if self.fused_rope_groups else ")"
        if self.fused_swiglu_blocks:
            line += f" ({self.fused_swiglu_blocks} SwiGLU blocks fused, producers: {self.producers})"
        if self.fused_loss_head:
            line += " (lm_head's loss fused)"
        if not self.skipped:
            return line
        groups: dict[str, list[str]] = {}
        for fqn in self.skipped:
            groups.setdefault(self.skip_category.get(fqn, self.skipped[fqn]), []).append(fqn)
        parts = [f"{fqns[0]} ({cat})" if len(fqns) == 1 else f"{len(fqns)} {cat}" for cat, fqns in groups.items()]
        return f"{line}; skipped: " + ", ".join(parts)


def check_model_ready(model: nn.Module, cfg: FP8Config) -> None:
    """Refuse a model that cannot be converted now: a bare linear, already compiled, not BF16 on its device."""
    if isinstance(model, nn.Linear):
        raise ConfigError(
            "convert_model_to_fp8 converts the nn.Linear layers inside a model in place; got a bare nn.Linear. "
            "Wrap it in a module (e.g. nn.Sequential(linear))."
        )
    compiled = compiled_submodules(model)
    if compiled:
        raise ConfigError(
            f"the model is already compiled ({', '.join(compiled[:3])}), so FP8 conversion would not reach the "
            f"compiled graph. Order: {ORDER}. Convert the uncompiled model, then call torch.compile on the result."
        )
    where = "on CUDA (or CPU with --fp8_emulate)" if cfg.fp8_emulate else "on CUDA"
    bad, on_cpu = [], False
    for name, param in model.named_parameters():
        if not param.is_floating_point():
            continue
        wrong_device = param.device.type != "cuda" and not (cfg.fp8_emulate and param.device.type == "cpu")
        on_cpu |= wrong_device and param.device.type == "cpu"
        if param.dtype != torch.bfloat16 or wrong_device:
            bad.append(f"{name} ({param.dtype}, {param.device})")
    if bad:
        fix = 'model.to(device="cuda", dtype=torch.bfloat16)'
        if cfg.fp8_emulate:
            fix += " (or model.to(dtype=torch.bfloat16) on CPU with --fp8_emulate)"
        cpu_hint = (
            " FP8 needs an H100-class GPU (sm_89+); on CPU use --fp8_emulate for numerics tests only, it is slow."
            if on_cpu
            else ""
        )
        raise ConfigError(
            f"FP8 conversion needs every floating-point parameter in bfloat16 {where}; {len(bad)} are not, e.g. "
            f"{', '.join(bad[:3])}. Order: {ORDER}. Call {fix} before converting.{cpu_hint}"
        )


def nothing_converted_error(report: FP8ConversionReport) -> ConfigError:
    if not report.skipped:
        return ConfigError("FP8 conversion found no nn.Linear layers in the model; run without --use_fp8.")
    hints = []
    categories = set(report.skip_category.values())
    if SKIP_LM_HEAD in categories:
        hints.append("--fp8_lm_head converts the output projection")
    if SKIP_SMALL in categories:
        hints.append(
            "--no_fp8_shape_filter (the 366m preset turns the filter on; or use a wider model: "
            "the thresholds are in the reasons)"
        )
    if SKIP_NOT_16 in categories:
        hints.append("use layer dims divisible by 16")
    hints.append("or run without --use_fp8 (BF16)")
    # One line: the layers grouped by why they were skipped, one example each (the summary lists every layer).
    groups: dict[str, list[str]] = {}
    for fqn, reason in report.skipped.items():
        groups.setdefault(report.skip_category.get(fqn, reason), []).append(fqn)
    why = "; ".join(
        f"{len(fqns)} like {fqns[0]}: {report.skipped[fqns[0]]}"
        if len(fqns) > 1
        else f"{fqns[0]}: {report.skipped[fqns[0]]}"
        for fqns in groups.values()
    )
    return ConfigError(
        f"FP8 conversion would convert none of the model's {report.n_linear} linear layers ({why}). To use FP8: "
        f"{'; '.join(hints)}."
    )


def decide_conversions(model: nn.Module, cfg: FP8Config, report: FP8ConversionReport) -> None:
    """Fill `report` with every nn.Linear of the model: converted, or skipped with the reason; raise ConfigError if
    nothing would convert. Both FP8 paths decide by this one rule."""
    file_decisions(model, skip_rule(cfg), report)
    if not report.converted:
        raise nothing_converted_error(report)


def file_decisions(
    model: nn.Module, skip: Callable[[nn.Module, str], tuple[str, str] | None], report: FP8ConversionReport
) -> None:
    """Every nn.Linear of the model into `report`: converted, or skipped with `skip`'s (category, reason)."""
    # remove_duplicate=False visits names exactly as torchao's own traversal does.
    for fqn, module in model.named_modules(remove_duplicate=False):
        if not is_linear(module, fqn):
            continue
        decision = skip(module, fqn)
        if decision is None:
            report.converted.append(fqn)
        else:
            report.skip_category[fqn], report.skipped[fqn] = decision


def check_keys_unchanged(model: nn.Module, keys_before: list[str]) -> None:
    """A conversion must leave the state-dict keys as they were, so that BF16 and FP8 checkpoints load into each
    other."""
    if list(model.state_dict().keys()) != keys_before:
        raise RuntimeError("FP8 conversion changed the model's state-dict keys; BF16/FP8 checkpoints would not load")
