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
from cs336_basics.lora.layers import FrozenFp8LMHead, FrozenFp8SwiGLU, FrozenLinear, FrozenSharedInput
from cs336_basics.model.layers import SwiGLU
from cs336_basics.precision import skip_reason
from cs336_basics.precision.fp8 import FAST_ACCUM_BACKWARD_NOTE, is_lm_head
from cs336_basics.precision.fused.convert import fast_accum_backward, fused_dtypes, set_child
from cs336_basics.precision.fused.scaling import DelayedScalingState, SiteScaling


@dataclass
class LoRAReport:
    rank: int
    scale: float
    targets: tuple[str, ...]
    fp8_layers: list[str] = field(default_factory=list)  # frozen base linears whose GEMMs run in FP8
    bf16_layers: dict[str, str] = field(default_factory=dict)  # the others -> why not FP8
    adapter_layers: list[str] = field(default_factory=list)
    shared_input_groups: int = 0  # FP8 groups (q/k/v, w1/w3) whose input is cast once
    fp8_swiglu_blocks: int = 0  # SwiGLU blocks run as one FP8 unit (activation and its gradients made in FP8)
    fused_loss_head: bool = False  # an FP8 head that computes the loss and writes the logits' gradient in FP8
    scaling: str | None = None  # how the FP8 base scales its inputs and gradients: "dynamic" or "delayed"
    fast_accum_backward: bool = False  # --fp8_fast_accum_backward
    trainable: int = 0
    frozen: int = 0

    def summary_lines(self) -> list[tuple[str, str]]:
        """(label, text) rows for the configuration summary."""
        base = f"{len(self.fp8_layers)} frozen linears in FP8 (weights cast once), {len(self.bf16_layers)} in BF16"
        if self.bf16_layers:
            reasons = sorted(set(self.bf16_layers.values()))
            base += f" ({'; '.join(reasons)})"
        if self.fp8_layers:
            base += (
                f"; inputs and gradients scaled {self.scaling}"
                f"{', ' + FAST_ACCUM_BACKWARD_NOTE if self.fast_accum_backward else ''}; "
                f"{self.shared_input_groups} shared input casts, "
                f"{self.fp8_swiglu_blocks} SwiGLU blocks made in FP8, loss "
                f"{'fused into the FP8 head' if self.fused_loss_head else 'after the head'}"
            )
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
    layer is a target. FP8 layers that share an input cast it once (fp8.fp8_share_input_casts), and FP8 SwiGLU blocks
    without adapters make their activation in FP8 (fp8.fp8_fused_swiglu), as on the fused pretraining path. Raises
    ConfigError if the targets match no layer or FP8 was asked for and no layer takes it."""
    targets = lora_target_list(ft.lora_targets)
    report = LoRAReport(rank=ft.lora_rank, scale=ft.scale, targets=targets)
    delayed = fp8 is not None and fp8.fp8_scaling == "delayed"
    for p in model.parameters():
        p.requires_grad_(False)
    linears = [(fqn, m) for fqn, m in model.named_modules() if isinstance(m, nn.Linear)]
    for fqn, linear in linears:
        reason = skip_reason(linear, fqn, fp8) if fp8 is not None else "FP8 off"
        rank = ft.lora_rank if _target_of(fqn) in targets else 0
        scaling = None
        if reason is None:  # FP8: its input and output gradient cast per step (its weight is cast once)
            per_head = _target_of(fqn) in ("q", "k", "v")  # their gradients come from attention, head by head
            grad_row = model.config.head_dim if per_head else None
            fast = fast_accum_backward(fp8, linear, fqn)
            scaling = SiteScaling(fused_dtypes(fp8), fast, delayed, linear.weight.device, 1, grad_row)
        fused_loss = scaling is not None and rank == 0 and is_lm_head(linear, fqn)
        layer = (FrozenFp8LMHead if fused_loss else FrozenLinear)(
            linear, scaling, rank=rank, scale=ft.scale, dropout=ft.lora_dropout
        )
        set_child(model, fqn, layer)
        report.fused_loss_head |= fused_loss
        if reason is None:
            report.fp8_layers.append(fqn)
        else:
            report.bf16_layers[fqn] = reason
        if rank:
            report.adapter_layers.append(fqn)
    if not report.adapter_layers:
        raise ConfigError(f"--lora_targets {ft.lora_targets} matched no linear layer of this model.")
    if fp8 is not None and not report.fp8_layers:
        reasons = "; ".join(sorted(set(report.bf16_layers.values())))
        raise ConfigError(
            f"FP8 was asked for, but no frozen base linear passes the FP8 filters ({reasons}). Pass "
            "--no_fp8_shape_filter (or --fp8_lm_head) to run the base in FP8, or --no_use_fp8."
        )
    if fp8 is not None:
        _group_fp8_layers(model, fp8, report)
    if delayed:  # the trainer advances the scales once per step (model.fp8_scaling, as on the fused path)
        sites = [m.scaling for m in model.modules() if isinstance(m, FrozenLinear) and m.fp8]
        model.fp8_scaling = DelayedScalingState(
            sites, fp8.fp8_amax_history_len, fp8.fp8_amax_compute_algo, fp8.fp8_margin
        )
    report.scaling = fp8.fp8_scaling if fp8 is not None else None
    report.fast_accum_backward = fp8 is not None and fp8.fp8_fast_accum_backward
    seen = {id(p): p for p in model.parameters()}.values()  # tied weights once
    report.trainable = sum(p.numel() for p in seen if p.requires_grad)
    report.frozen = sum(p.numel() for p in seen if not p.requires_grad)
    return report


def _group_fp8_layers(model: nn.Module, fp8: FP8Config, report: LoRAReport) -> None:
    """FP8 SwiGLU blocks without adapters become FrozenFp8SwiGLU units; FP8 layers that read one input (a module's
    SHARED_INPUT group) are run together by a FrozenSharedInput set as that group's attribute."""

    def fp8_layers(module: nn.Module, names) -> list[FrozenLinear] | None:
        layers = [getattr(module, name) for name in names]
        return layers if all(isinstance(m, FrozenLinear) and m.fp8 for m in layers) else None

    for fqn, module in list(model.named_modules()):
        layers = fp8_layers(module, ("w1", "w2", "w3")) if isinstance(module, SwiGLU) else None
        if fp8.fp8_fused_swiglu and layers and not any(m.rank for m in layers):
            set_child(model, fqn, FrozenFp8SwiGLU(*layers))
            report.fp8_swiglu_blocks += 1
            continue
        for attr, names in getattr(module, "SHARED_INPUT", {}).items() if fp8.fp8_share_input_casts else ():
            members = fp8_layers(module, names)
            if members:
                setattr(module, attr, FrozenSharedInput(tuple(members)))
                report.shared_input_groups += 1


def count_frozen_fp8_linears(model: nn.Module) -> int:
    """Frozen base linears running in FP8, counted from the model's modules (independently of the report)."""
    return sum(1 for m in model.modules() if isinstance(m, FrozenLinear) and m.fp8)
