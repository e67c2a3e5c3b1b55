"""Conversion to this package's FP8 path (`--fp8_path fused`): which linears become FP8, and the swap.

Each nn.Linear that passes the filters becomes an Fp8Linear. The filters, their reasons and the report are the rules
every FP8 path shares (precision/rules.py), so both paths convert the same layers by the same rules and report them the
same way. Layers a model declares as reading one input (a module's SHARED_INPUT, e.g. attention's q/k/v) are run
together by an Fp8SharedInputLinears, which casts that input once, when every one of them converts; attention's q/k/v
group also takes over RoPE (Fp8QkvRope, --fp8_fused_rope), so that one kernel writes their gradients in FP8. A SwiGLU
block whose three linears all convert becomes one Fp8SwiGLU (--fp8_fused_swiglu), whose kernels write its activation and
the activation's gradients in FP8. Each FP8 linear has its own SiteScaling; with delayed scaling the converter keeps one
DelayedScalingState that holds their amax histories and updates their scales once per step (the Trainer's hooks,
precision/converter.py).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from cs336_basics.config import FP8Config
from cs336_basics.errors import ConfigError
from cs336_basics.precision.converter import FP8Converter, delayed_scaling
from cs336_basics.precision.fused.head import Fp8LMHead
from cs336_basics.precision.fused.linear import Fp8Linear, Fp8SharedInputLinears
from cs336_basics.precision.fused.qkv_rope import Fp8QkvRope, rope_unit_heads
from cs336_basics.precision.fused.scaling import E4M3, E5M2, SiteScaling
from cs336_basics.precision.fused.swiglu import Fp8SwiGLU
from cs336_basics.precision.fused.units import fast_accum_backward, fp8_units, fused_dtypes, set_child
from cs336_basics.precision.rules import (
    ORDER,
    FP8ConversionReport,
    check_keys_unchanged,
    check_model_ready,
    decide_conversions,
    is_lm_head,
)

FUSED_MODULES = (Fp8Linear, Fp8SharedInputLinears, Fp8QkvRope, Fp8SwiGLU)  # Fp8LMHead is an Fp8Linear
_NAMES = {E4M3: "E4M3", E5M2: "E5M2"}


def count_fused_linears(model: nn.Module) -> int:
    """Linear layers whose GEMMs run in FP8 on the fused path (members of a shared-input group included)."""
    return sum(
        1 if isinstance(m, Fp8Linear) else len(m.linears) for m in model.modules() if isinstance(m, FUSED_MODULES)
    )


class FusedFP8(FP8Converter):
    """This package's FP8 path (`--fp8_path fused`)."""

    path = "fused"

    @staticmethod
    def defaults(fp8: FP8Config, world_size: int, cuda_graphs: bool) -> tuple[str, dict[str, Any]]:
        # Delayed scaling measured faster than dynamic on one process and under DDP, where the ranks reduce their
        # amaxes once per step (INDEX.md: 2026-11-28-ddp-delayed-4xh200). Fast backward accumulation moved
        # pre-training's loss (docs/fp8.md): off until a loss check says otherwise.
        return "the fused path's", {
            "fp8_lm_head": True,
            "fp8_shape_filter": False,
            "fp8_scaling": "delayed",
            "fp8_fast_accum_backward": False,
        }

    @staticmethod
    def check_options(fp8: FP8Config, world_size: int = 1) -> None:
        """Refuse, with the reason, the settings this path does not have."""
        if fp8.fp8_recipe != "tensorwise":
            raise ConfigError(
                f"--fp8_path fused implements the tensorwise recipe only; got --fp8_recipe {fp8.fp8_recipe}. Use "
                "--fp8_recipe tensorwise, or --fp8_path torchao for the rowwise recipes."
            )
        if fp8.fp8_all_gather:
            raise ConfigError(
                "--fp8_all_gather is TorchAO's FP8 all-gather under FSDP2; --fp8_path fused has no FP8 all-gather of "
                "sharded weights (under FSDP2 it all-gathers them in BF16). Use --fp8_path torchao, or drop "
                "--fp8_all_gather."
            )

    def convert(self, model: nn.Module) -> FP8ConversionReport:
        """Swap the model's eligible linears for FP8 ones, in place; linears that share an input share its cast.

        The model must be uncompiled, in BF16 on CUDA (CPU with --fp8_emulate: the same FP8 casts and GEMMs run on
        the CPU, slowly). Parameter names and the state dict are unchanged. Raises ConfigError when nothing would
        convert."""
        cfg = self.fp8
        check_model_ready(model, cfg)
        if count_fused_linears(model):
            raise ConfigError(f"the model is already converted to FP8; convert once (order: {ORDER}).")
        dtypes = fused_dtypes(cfg)
        fmt = f"{_NAMES[dtypes[0]]} fwd / {_NAMES[dtypes[2]]} grad"
        report = FP8ConversionReport(
            recipe="tensorwise", format=fmt, format_short=fmt, emulate=cfg.fp8_emulate, path="fused",
            scaling=cfg.fp8_scaling, fast_accum_backward=bool(cfg.fp8_fast_accum_backward),
        )  # fmt: skip
        decide_conversions(model, cfg, report)
        biased = [name for name in report.converted if model.get_submodule(name).bias is not None]
        if biased:
            raise ConfigError(
                f"--fp8_path fused converts linear layers without bias; {', '.join(biased[:3])} have one. Use "
                "--fp8_path torchao for this model."
            )
        device = next(model.parameters()).device
        delayed = cfg.fp8_scaling == "delayed"
        scalings = {
            name: SiteScaling(dtypes, fast_accum_backward(cfg, linear, name), delayed, device, linear.out_features)
            for name, linear in ((name, model.get_submodule(name)) for name in report.converted)
        }
        keys_before = list(model.state_dict().keys())
        blocks, groups = fp8_units(model, cfg, set(report.converted).__contains__)
        grouped = set()
        for fqn in blocks:
            block = model.get_submodule(fqn)
            names = [f"{fqn}.{m}" if fqn else m for m in ("w1", "w3", "w2")]
            set_child(model, fqn, Fp8SwiGLU(block.w1, block.w2, block.w3, tuple(scalings[n] for n in names)))
            grouped.update(names)
        for owner, attr, members in groups:
            names = [f"{owner}.{m}" if owner else m for m in members]
            linears = tuple(model.get_submodule(name) for name in names)
            member_scalings = tuple(scalings[n] for n in names)
            attention = model.get_submodule(owner)
            heads = rope_unit_heads(attention)
            if cfg.fp8_fused_rope and heads is not None:
                attention.qkv_rope = Fp8QkvRope(linears, member_scalings, attention.rope, heads)
                report.fused_rope_groups += 1
            else:
                set_child(model, f"{owner}.{attr}" if owner else attr, Fp8SharedInputLinears(linears, member_scalings))
            grouped.update(names)
        for name in report.converted:
            if name not in grouped:
                linear = model.get_submodule(name)
                head = is_lm_head(linear, name)
                set_child(model, name, (Fp8LMHead if head else Fp8Linear)(linear, scalings[name]))
                report.fused_loss_head |= head
        if delayed:
            self.scaling = delayed_scaling([scalings[name] for name in report.converted], cfg, self.world_size)
        report.shared_input_groups = len(groups)
        report.fused_swiglu_blocks = len(blocks)
        if blocks:
            report.producers = model.get_submodule(blocks[0]).producers
        check_keys_unchanged(model, keys_before)
        return report

    def count(self, model: nn.Module) -> int:
        return count_fused_linears(model)
