"""Turning a base model into a LoRA fine-tune: every parameter frozen, every linear a FrozenLinear (FP8 where the
FP8 filters take it), adapters on the target layers; and the report the summary prints.

Why our own module rather than PEFT: PEFT's LoRA layer wraps an nn.Linear and calls it, so the base would run as
whatever that linear is (a BF16 GEMM, or TorchAO's Float8Linear, which re-casts its weight to FP8 every step); the
frozen FP8 base we want (weight cast once, no weight-gradient GEMM, x not saved) is a different linear, which PEFT
would only wrap. PEFT also renames the base weight (`base_layer.weight`), so course-layout state dicts would no longer
load as they are. The adapter itself is two matrices and one line of forward (layers.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from cs336_basics.config import LORA_TARGET_MODULES, FinetuneConfig, FP8Config, lora_target_list
from cs336_basics.errors import ConfigError
from cs336_basics.lora.layers import FrozenLinear
from cs336_basics.precision import skip_reason


@dataclass
class LoRAReport:
    rank: int
    scale: float
    targets: tuple[str, ...]
    fp8_layers: list[str] = field(default_factory=list)  # frozen base linears whose GEMMs run in FP8
    bf16_layers: dict[str, str] = field(default_factory=dict)  # the others -> why not FP8
    adapter_layers: list[str] = field(default_factory=list)
    trainable: int = 0
    frozen: int = 0

    def summary_lines(self) -> list[tuple[str, str]]:
        """(label, text) rows for the configuration summary."""
        base = f"{len(self.fp8_layers)} frozen linears in FP8 (weights cast once), {len(self.bf16_layers)} in BF16"
        if self.bf16_layers:
            reasons = sorted(set(self.bf16_layers.values()))
            base += f" ({'; '.join(reasons)})"
        share = self.trainable / max(self.trainable + self.frozen, 1)
        return [
            (
                "LoRA",
                f"rank {self.rank}, scale {self.scale:g}, adapters on {'+'.join(self.targets)}: "
                f"{len(self.adapter_layers)} layers",
            ),
            ("LoRA base", base + "; no weight-gradient GEMM (base weights frozen)"),
            ("trainable", f"{self.trainable:,} trainable ({share:.3%}), {self.frozen:,} frozen"),
        ]


def _target_of(fqn: str) -> str | None:
    last = fqn.rsplit(".", 1)[-1]
    return next((name for name, module in LORA_TARGET_MODULES.items() if module == last), None)


def apply_lora(model: nn.Module, ft: FinetuneConfig, fp8: FP8Config | None) -> LoRAReport:
    """Freeze `model` (built, on its device and dtype, base weights loaded, uncompiled) and replace each of its
    linear layers by a FrozenLinear: in FP8 if `fp8` is given and its filters take the layer, with adapters if the
    layer is a target. Raises ConfigError if the targets match no layer or FP8 was asked for and no layer takes it."""
    targets = lora_target_list(ft.lora_targets)
    report = LoRAReport(rank=ft.lora_rank, scale=ft.scale, targets=targets)
    for p in model.parameters():
        p.requires_grad_(False)
    linears = [(fqn, m) for fqn, m in model.named_modules() if isinstance(m, nn.Linear)]
    for fqn, linear in linears:
        reason = skip_reason(linear, fqn, fp8) if fp8 is not None else "FP8 off"
        target = _target_of(fqn) in targets
        layer = FrozenLinear(
            linear, fp8=reason is None, rank=ft.lora_rank if target else 0, scale=ft.scale, dropout=ft.lora_dropout
        )
        parent_name, _, child = fqn.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, layer)
        if reason is None:
            report.fp8_layers.append(fqn)
        else:
            report.bf16_layers[fqn] = reason
        if target:
            report.adapter_layers.append(fqn)
    if not report.adapter_layers:
        raise ConfigError(f"--lora_targets {ft.lora_targets} matched no linear layer of this model.")
    if fp8 is not None and not report.fp8_layers:
        reasons = "; ".join(sorted(set(report.bf16_layers.values())))
        raise ConfigError(
            f"FP8 was asked for, but no frozen base linear passes the FP8 filters ({reasons}). Pass "
            "--no_fp8_shape_filter (or --fp8_lm_head) to run the base in FP8, or --no_use_fp8."
        )
    seen = {id(p): p for p in model.parameters()}.values()  # tied weights once
    report.trainable = sum(p.numel() for p in seen if p.requires_grad)
    report.frozen = sum(p.numel() for p in seen if not p.requires_grad)
    return report


def count_frozen_fp8_linears(model: nn.Module) -> int:
    """Frozen base linears running in FP8, counted from the model's modules (independently of the report)."""
    return sum(1 for m in model.modules() if isinstance(m, FrozenLinear) and m.fp8)
