"""How this package's FP8 linears are grouped and typed, by the rules both of its FP8 paths share: the fused
pretraining path (fused/convert.py) and a LoRA fine-tune's frozen base (lora/). Neither path imports the other; both
import these and the FP8 modules and ops beside them in fused/."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from cs336_basics.config import FP8Config
from cs336_basics.model.layers import SwiGLU
from cs336_basics.precision.fused.scaling import E4M3, E5M2
from cs336_basics.precision.rules import is_lm_head


def fused_dtypes(cfg: FP8Config) -> tuple[torch.dtype, torch.dtype, torch.dtype]:
    """(input, weight, grad) dtypes: E4M3 forward; E5M2 gradients unless --fp8_format e4m3."""
    return (E4M3, E4M3, E4M3 if cfg.fp8_format == "e4m3" else E5M2)


def fast_accum_backward(cfg: FP8Config, linear: nn.Module, fqn: str) -> bool:
    """Whether the linear at `fqn` takes --fp8_fast_accum_backward: every FP8 linear but the lm_head. Each row of the
    logits' gradient, softmax - onehot, sums to zero, so the head's dx sums vocabulary-many terms that cancel down to
    a result far smaller than they are: with fast accumulation its error outgrew the result (the gradients below the
    head were off by about as much as their size, against a few percent without it), and its dW's error doubled
    (INDEX.md: 2026-11-23-lora-loss-safe-h200). Left unchosen (None, before
    precision.choose_fp8 resolves it), it is off."""
    return bool(cfg.fp8_fast_accum_backward) and not is_lm_head(linear, fqn)


def set_child(model: nn.Module, fqn: str, module: nn.Module) -> None:
    """Put `module` at `fqn` in `model` (its parent's attribute), in place of what was there."""
    parent, _, name = fqn.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, name, module)


def fp8_units(
    model: nn.Module, fp8: FP8Config, in_fp8: Callable[[str], bool], fusable: Callable[[str], bool] | None = None
) -> tuple[list[str], list[tuple[str, str, tuple[str, ...]]]]:
    """Which FP8 linears run together, by the rules both of this package's FP8 paths share (the fused pretraining
    path and a LoRA fine-tune's frozen base):
      - the SwiGLU blocks whose three linears are all `fusable` (default: all `in_fp8`) run as one FP8 unit each
        (--fp8_fused_swiglu): their fqns;
      - outside those blocks, each group of linears a module declares as reading one input (its SHARED_INPUT, e.g.
        attention's q/k/v) whose members are all `in_fp8` casts that input once (--fp8_share_input_casts):
        (owner fqn, the attribute the group is set as, the members' attribute names).
    The predicates take a linear's fqn."""
    fusable = fusable or in_fp8

    def fqns(owner: str, members) -> list[str]:
        return [f"{owner}.{m}" if owner else m for m in members]

    modules = list(model.named_modules())
    blocks = [
        fqn for fqn, module in modules
        if fp8.fp8_fused_swiglu and isinstance(module, SwiGLU) and all(map(fusable, fqns(fqn, ("w1", "w2", "w3"))))
    ]  # fmt: skip
    in_block = set(blocks)
    groups = [
        (fqn, attr, tuple(members))
        for fqn, module in modules if fp8.fp8_share_input_casts and fqn not in in_block
        for attr, members in getattr(module, "SHARED_INPUT", {}).items() if all(map(in_fp8, fqns(fqn, members)))
    ]  # fmt: skip
    return blocks, groups
