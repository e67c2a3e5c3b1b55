"""Conversion to this package's FP8 path (`--fp8_path fused`): which linears become FP8, and the swap.

Each nn.Linear that passes the filters becomes an Fp8Linear. The filters, their reasons and the report are the
TorchAO path's (fp8.py), so both paths convert the same layers by the same rules and report them the same way.
Layers a model declares as reading one input (a module's SHARED_INPUT, e.g. attention's q/k/v) are run together
by an Fp8SharedInputLinears, which casts that input once, when every one of them converts. A SwiGLU block whose
three linears all convert becomes one Fp8SwiGLU (--fp8_fused_swiglu), whose kernels write its activation and the
activation's gradients in FP8. Each FP8 linear has its
own SiteScaling; with delayed scaling the model also gains one DelayedScalingState (`model.fp8_scaling`) that keeps
their amax histories and updates their scales once per step.
"""

from __future__ import annotations

import torch
from torch import nn

from cs336_basics.config import FP8Config
from cs336_basics.errors import ConfigError
from cs336_basics.model.layers import SwiGLU
from cs336_basics.precision.fp8 import ORDER, FP8ConversionReport, check_model_ready, decide_conversions, is_lm_head
from cs336_basics.precision.fused.head import Fp8LMHead
from cs336_basics.precision.fused.linear import Fp8Linear, Fp8SharedInputLinears
from cs336_basics.precision.fused.scaling import E4M3, E5M2, DelayedScalingState, SiteScaling
from cs336_basics.precision.fused.swiglu import Fp8SwiGLU

FUSED_MODULES = (Fp8Linear, Fp8SharedInputLinears, Fp8SwiGLU)  # Fp8LMHead is an Fp8Linear
_NAMES = {E4M3: "E4M3", E5M2: "E5M2"}


def fused_dtypes(cfg: FP8Config) -> tuple[torch.dtype, torch.dtype, torch.dtype]:
    """(input, weight, grad) dtypes: E4M3 forward; E5M2 gradients unless --fp8_format e4m3."""
    return (E4M3, E4M3, E4M3 if cfg.fp8_format == "e4m3" else E5M2)


def fast_accum_backward(cfg: FP8Config, linear: nn.Module, fqn: str) -> bool:
    """Whether the linear at `fqn` takes --fp8_fast_accum_backward: every FP8 linear but the lm_head. Each row of the
    logits' gradient, softmax - onehot, sums to zero, so the head's dx sums vocabulary-many terms that cancel down to
    a result far smaller than they are: with fast accumulation its error outgrew the result (the gradients below the
    head were off by 91-122%, 6-7% without it), and its dW's error doubled
    (benchmarks/results/2026-11-23-lora-loss-safe-h200/README.md)."""
    return cfg.fp8_fast_accum_backward and not is_lm_head(linear, fqn)


def count_fused_linears(model: nn.Module) -> int:
    """Linear layers whose GEMMs run in FP8 on the fused path (members of a shared-input group included)."""
    return sum(
        1 if isinstance(m, Fp8Linear) else len(m.linears) for m in model.modules() if isinstance(m, FUSED_MODULES)
    )


def set_child(model: nn.Module, fqn: str, module: nn.Module) -> None:
    """Put `module` at `fqn` in `model` (its parent's attribute), in place of what was there."""
    parent, _, name = fqn.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, name, module)


def convert_model_to_fused_fp8(model: nn.Module, cfg: FP8Config) -> FP8ConversionReport:
    """Swap the model's eligible linears for FP8 ones, in place; linears that share an input share its cast.

    The model must be uncompiled, in BF16 on CUDA (CPU with cfg.fp8_emulate: the same FP8 casts and GEMMs run on the
    CPU, slowly). Parameter names and the state dict are unchanged. Raises ConfigError when nothing would convert.
    """
    check_model_ready(model, cfg)
    if count_fused_linears(model):
        raise ConfigError(f"the model is already converted to FP8; convert once (order: {ORDER}).")
    dtypes = fused_dtypes(cfg)
    fmt = f"{_NAMES[dtypes[0]]} fwd / {_NAMES[dtypes[2]]} grad"
    report = FP8ConversionReport(
        recipe="tensorwise", format=fmt, format_short=fmt, emulate=cfg.fp8_emulate, path="fused",
        scaling=cfg.fp8_scaling, fast_accum_backward=cfg.fp8_fast_accum_backward,
    )  # fmt: skip
    decide_conversions(model, cfg, report)
    biased = [name for name in report.converted if model.get_submodule(name).bias is not None]
    if biased:
        raise ConfigError(
            f"--fp8_path fused converts linear layers without bias; {', '.join(biased[:3])} have one. Use --fp8_path "
            "torchao for this model."
        )

    converted = set(report.converted)
    device = next(model.parameters()).device
    delayed = cfg.fp8_scaling == "delayed"
    linears = {name: model.get_submodule(name) for name in report.converted}
    scalings = {
        name: SiteScaling(
            dtypes, fast_accum_backward(cfg, linear, name), delayed, device, weight_rows=linear.out_features
        )
        for name, linear in linears.items()
    }
    keys_before = list(model.state_dict().keys())

    # SwiGLU blocks whose three linears all convert run as one FP8 unit.
    fused_blocks = []
    if cfg.fp8_fused_swiglu:
        for fqn, module in model.named_modules():
            names = [f"{fqn}.{m}" if fqn else m for m in ("w1", "w3", "w2")]
            if isinstance(module, SwiGLU) and all(name in converted for name in names):
                fused_blocks.append((fqn, names))
    in_block = {name for _, names in fused_blocks for name in names}
    for fqn, names in fused_blocks:
        block = model.get_submodule(fqn)
        set_child(model, fqn, Fp8SwiGLU(block.w1, block.w2, block.w3, tuple(scalings[n] for n in names)))

    # Shared-input groups whose members all convert: (owner fqn, attribute, member fqns).
    groups = []
    if cfg.fp8_share_input_casts:
        for fqn, module in model.named_modules():
            for attr, members in getattr(module, "SHARED_INPUT", {}).items():
                names = [f"{fqn}.{m}" if fqn else m for m in members]
                if all(name in converted for name in names):
                    groups.append((fqn, attr, names))
    for owner, attr, names in groups:
        linears = tuple(model.get_submodule(name) for name in names)
        set_child(
            model,
            f"{owner}.{attr}" if owner else attr,
            Fp8SharedInputLinears(linears, tuple(scalings[n] for n in names)),
        )
    grouped = in_block | {name for _, _, names in groups for name in names}
    for name in report.converted:
        if name not in grouped:
            linear = model.get_submodule(name)
            head = is_lm_head(linear, name)
            set_child(model, name, (Fp8LMHead if head else Fp8Linear)(linear, scalings[name]))
            report.fused_loss_head |= head
    if delayed:
        sites = [scalings[name] for name in report.converted]
        model.fp8_scaling = DelayedScalingState(
            sites, cfg.fp8_amax_history_len, cfg.fp8_amax_compute_algo, cfg.fp8_margin
        )
    report.shared_input_groups = len(groups)
    report.fused_swiglu_blocks = len(fused_blocks)
    if fused_blocks:
        report.producers = model.get_submodule(fused_blocks[0][0]).producers
    if list(model.state_dict().keys()) != keys_before:
        raise RuntimeError("FP8 conversion changed the model's state-dict keys; BF16/FP8 checkpoints would not load")
    return report
