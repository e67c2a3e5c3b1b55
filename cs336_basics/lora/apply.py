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
from typing import Any

import torch
from torch import nn

from cs336_basics.config import (
    LORA_FP8_PATH,
    LORA_TARGET_MODULES,
    FinetuneConfig,
    FP8Config,
    RunConfig,
    lora_target_list,
)
from cs336_basics.errors import ConfigError
from cs336_basics.lora.layers import (
    FrozenFp8LMHead,
    FrozenFp8QkvRope,
    FrozenFp8SwiGLU,
    FrozenLinear,
    FrozenSharedInput,
    projected_together,
)
from cs336_basics.precision.choice import register_fp8_converter
from cs336_basics.precision.converter import FP8Converter, delayed_scaling
from cs336_basics.precision.fused.qkv_rope import rope_unit_heads
from cs336_basics.precision.fused.scaling import SiteScaling
from cs336_basics.precision.fused.units import fast_accum_backward, fp8_units, fused_dtypes, set_child
from cs336_basics.precision.rules import FAST_ACCUM_BACKWARD_NOTE, FP8ConversionReport, is_lm_head, skip_reason


@dataclass
class LoRAReport:
    rank: int
    scale: float
    targets: tuple[str, ...]
    # The frozen base's linears, reported as any FP8 conversion is: converted = run in FP8, skipped = kept in BF16 and
    # why, and how the FP8 ones are scaled and grouped.
    base: FP8ConversionReport
    adapter_layers: list[str] = field(default_factory=list)
    trainable: int = 0
    frozen: int = 0
    weights_in_host_memory: int = 0  # FP8 frozen linears whose BF16 weight was moved to CPU memory
    base_dtype: str = "BF16"  # what the base's linears kept out of FP8 run in (float32 in a float32 run on the CPU)

    def summary_lines(self) -> list[tuple[str, str]]:
        """(label, text) rows for the configuration summary."""
        b = self.base
        text = f"{b.n_converted} frozen linears in FP8 (weights cast once), {len(b.skipped)} in {self.base_dtype}"
        if b.skipped:
            reasons = sorted(set(b.skipped.values()))
            text += f" ({'; '.join(reasons)})"
        if b.converted:
            text += (
                f"; inputs and gradients scaled {b.scaling}"
                f"{', ' + FAST_ACCUM_BACKWARD_NOTE if b.fast_accum_backward else ''}; "
                f"{b.shared_input_groups} shared input casts, "
                f"{b.fused_swiglu_blocks} SwiGLU blocks made in FP8, loss "
                f"{'fused into the FP8 head' if b.fused_loss_head else 'after the head'}"
            )
        share = self.trainable / max(self.trainable + self.frozen, 1)
        return [
            (
                "LoRA",
                f"rank {self.rank}, scale {self.scale:g}, adapters on {'+'.join(self.targets)}: "
                f"{len(self.adapter_layers)} layers",
            ),
            ("LoRA base", text + "; no weight-gradient GEMM (base weights frozen)" + self._host_note()),
            ("trainable", f"{self.trainable:,} trainable ({share:.3%}), {self.frozen:,} frozen"),
        ]

    def _host_note(self) -> str:
        if not self.weights_in_host_memory:
            return ""
        n = self.weights_in_host_memory
        return f"; the BF16 weights of {n} FP8 linears kept in CPU memory (their GEMMs read the FP8 copies)"


HOST = torch.device("cpu")  # where the FP8 frozen linears' BF16 weights wait (tests put them on "meta")


def _move_weights_to_host(model: nn.Module, fp8_layers: list[FrozenLinear]) -> int:
    """Move the BF16 weight of each of `model`'s FP8 frozen linears to CPU memory; return how many moved. Their GEMMs
    read only the FP8 copies (the weight and its transposed copy: together the BF16 weight's size), so on the GPU the
    BF16 weight would only raise the peak above a BF16 base's. It stays on the GPU where another module reads it (a
    tied embedding). State dicts and merges see the same weight, on the host."""
    ids = {id(m) for m in fp8_layers}
    shared = {id(p) for m in model.modules() if id(m) not in ids for p in m.parameters(recurse=False)}
    moved = 0
    for layer in fp8_layers:
        if id(layer.weight) not in shared and layer.weight.device != HOST:
            layer.weight = nn.Parameter(layer.weight.detach().to(HOST), requires_grad=False)
            moved += 1
    return moved


def _target_of(fqn: str) -> str | None:
    last = fqn.rsplit(".", 1)[-1]
    return next((name for name, module in LORA_TARGET_MODULES.items() if module == last), None)


class LoRAConverter(FP8Converter):
    """A LoRA fine-tune's conversion: every parameter frozen, every linear a FrozenLinear (FP8 where `fp8` is given
    and its filters take the layer), adapters on the target layers. Its frozen FP8 base is an FP8 implementation of its
    own (weights cast once, no weight-gradient GEMM), registered as LORA_FP8_PATH with its defaults and checks; it
    runs whichever FP8 path the settings name."""

    path = LORA_FP8_PATH

    def __init__(self, ft: FinetuneConfig, fp8: FP8Config | None):
        self.ft = ft
        self.fp8 = fp8

    @classmethod
    def for_run(cls, config: RunConfig, world_size: int, fsdp_float8_all_gather: bool) -> LoRAConverter:
        return cls(config.finetune, config.fp8 if config.fp8.use_fp8 else None)

    @staticmethod
    def defaults(fp8: FP8Config, world_size: int, cuda_graphs: bool) -> tuple[str, dict[str, Any]]:
        # Measured on a LoRA base (docs/fine-tuning.md): delayed scaling pays only under CUDA graphs, where it was
        # measured with the FP8 head (INDEX.md: 2026-11-26-defaults-by-block, item 3). Fast
        # accumulation in the input-gradient GEMMs (a frozen base has no other backward GEMM) paid on both GPUs and
        # kept the fine-tune's loss (INDEX.md: 2026-11-27-lora-defaults-both-gpus, items 1, 4).
        either = {"fp8_shape_filter": False, "fp8_fast_accum_backward": True}
        if cuda_graphs:
            return "a LoRA base's under CUDA graphs", {"fp8_lm_head": True, "fp8_scaling": "delayed", **either}
        return "a LoRA base's", {"fp8_lm_head": False, "fp8_scaling": "dynamic", **either}

    @staticmethod
    def check_options(fp8: FP8Config, world_size: int = 1) -> None:
        """Refuse, with the reason, the FP8 settings the frozen base does not have (it takes either path's others)."""
        if fp8.use_fp8 is not False and fp8.fp8_recipe != "tensorwise":
            raise ConfigError(
                f"the frozen FP8 base of a LoRA run scales tensorwise; --fp8_recipe {fp8.fp8_recipe} was asked for. "
                "Use --fp8_recipe tensorwise, or --no_use_fp8 for a BF16 base."
            )
        if fp8.use_fp8 and fp8.fp8_emulate:
            raise ConfigError(
                "--fp8_emulate: a LoRA run's frozen FP8 base always runs real FP8 casts and GEMMs (torch._scaled_mm, "
                "on an FP8 GPU or with torch's CPU kernel on the CPU), never high-precision emulation. Drop "
                "--fp8_emulate."
            )

    def convert(self, model: nn.Module) -> LoRAReport:
        """Convert `model` (built, on its device and dtype, base weights loaded, uncompiled). FP8 layers that share
        an input cast it once (fp8.fp8_share_input_casts), and FP8 SwiGLU blocks without adapters make their
        activation in FP8 (fp8.fp8_fused_swiglu), as on the fused pretraining path (fused/units.py: fp8_units).
        Raises ConfigError if the targets match no layer or FP8 was asked for and no layer takes it."""
        ft, fp8 = self.ft, self.fp8
        targets = lora_target_list(ft.lora_targets)
        base = FP8ConversionReport(
            recipe="tensorwise", format="", emulate=False, path=LORA_FP8_PATH,
            scaling=fp8.fp8_scaling if fp8 is not None else "none",
            fast_accum_backward=fp8 is not None and bool(fp8.fp8_fast_accum_backward),
        )  # fmt: skip
        dtype = next(model.parameters()).dtype
        report = LoRAReport(
            rank=ft.lora_rank, scale=ft.scale, targets=targets, base=base,
            base_dtype="BF16" if dtype == torch.bfloat16 else str(dtype).removeprefix("torch."),
        )  # fmt: skip
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
            base.fused_loss_head |= fused_loss
            if reason is None:
                base.converted.append(fqn)
            else:
                base.skipped[fqn] = reason
            if rank:
                report.adapter_layers.append(fqn)
        if not report.adapter_layers:
            raise ConfigError(f"--lora_targets {ft.lora_targets} matched no linear layer of this model.")
        if fp8 is not None and not base.converted:
            reasons = "; ".join(sorted(set(base.skipped.values())))
            raise ConfigError(
                f"FP8 was asked for, but no frozen base linear passes the FP8 filters ({reasons}). Pass "
                "--no_fp8_shape_filter (or --fp8_lm_head) to run the base in FP8, or --no_use_fp8."
            )
        if fp8 is None:
            _group_bf16_adapters(model)
        else:
            _group_fp8_layers(model, fp8, report)
            fp8_layers = frozen_fp8_linears(model)
            if delayed:  # the Trainer advances the scales once per step, through this converter's hooks
                # In the model's module order, the order the checkpoints of earlier runs keep their histories in.
                self.scaling = delayed_scaling([m.scaling for m in fp8_layers], fp8)
            report.weights_in_host_memory = _move_weights_to_host(model, fp8_layers)
        seen = {id(p): p for p in model.parameters()}.values()  # tied weights once
        report.trainable = sum(p.numel() for p in seen if p.requires_grad)
        report.frozen = sum(p.numel() for p in seen if not p.requires_grad)
        return report

    def count(self, model: nn.Module) -> int:
        return count_frozen_fp8_linears(model)

    def fp8_report(self, report: LoRAReport) -> FP8ConversionReport:
        return report.base


register_fp8_converter(LoRAConverter)


def apply_lora(model: nn.Module, ft: FinetuneConfig, fp8: FP8Config | None) -> LoRAReport:
    """LoRAConverter(ft, fp8).convert(model), for a model that will not be trained with delayed scaling (a merge, a
    look at the converted layers): the converter, whose hooks advance delayed scales, is not kept."""
    return LoRAConverter(ft, fp8).convert(model)


def _group_fp8_layers(model: nn.Module, fp8: FP8Config, report: LoRAReport) -> None:
    """FP8 SwiGLU blocks without adapters become FrozenFp8SwiGLU units; FP8 layers that read one input (a module's
    SHARED_INPUT group) are run together by a FrozenSharedInput set as that group's attribute, or, for attention's
    q/k/v with --fp8_fused_rope, by a FrozenFp8QkvRope set as its `qkv_rope` (adapters and all)."""
    in_fp8 = set(report.base.converted).__contains__
    adapters = set(report.adapter_layers)
    blocks, groups = fp8_units(model, fp8, in_fp8, fusable=lambda fqn: in_fp8(fqn) and fqn not in adapters)
    for fqn in blocks:
        block = model.get_submodule(fqn)
        set_child(model, fqn, FrozenFp8SwiGLU(block.w1, block.w2, block.w3))
    for owner, attr, members in groups:
        module = model.get_submodule(owner)
        linears = tuple(getattr(module, name) for name in members)
        heads = rope_unit_heads(module)
        if fp8.fp8_fused_rope and heads is not None:
            module.qkv_rope = FrozenFp8QkvRope(linears, module.rope, heads)
            report.base.fused_rope_groups += 1
        else:
            setattr(module, attr, FrozenSharedInput(linears))
    report.base.fused_swiglu_blocks = len(blocks)
    report.base.shared_input_groups = len(groups)


def _group_bf16_adapters(model: nn.Module) -> None:
    """On a BF16 base, each group of linears that read one input (a module's SHARED_INPUT) whose adapters
    layers.adapter_deltas projects with one GEMM (layers.projected_together) runs as a FrozenSharedInput, as on an
    FP8 base."""
    for module in list(model.modules()):
        for attr, members in getattr(module, "SHARED_INPUT", {}).items():
            linears = tuple(getattr(module, name) for name in members)
            if all(isinstance(layer, FrozenLinear) for layer in linears) and projected_together(linears):
                setattr(module, attr, FrozenSharedInput(linears))


def frozen_fp8_linears(model: nn.Module) -> list[FrozenLinear]:
    """The frozen base linears running in FP8, in the model's module order."""
    return [m for m in model.modules() if isinstance(m, FrozenLinear) and m.fp8]


def count_frozen_fp8_linears(model: nn.Module) -> int:
    """Frozen base linears running in FP8, counted from the model's modules (independently of the report)."""
    return len(frozen_fp8_linears(model))
