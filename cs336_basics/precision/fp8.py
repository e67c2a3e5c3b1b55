"""FP8 training through TorchAO: our FP8Config -> torchao's Float8LinearConfig, and the swap to its Float8Linear.

Order matters and is enforced here: create model -> move to CUDA + BF16 -> convert to FP8 -> torch.compile.
Conversion swaps nn.Linear modules for torchao's Float8Linear (a subclass that keeps the same `weight`
Parameter object), so parameter names, state-dict keys and optimizer parameter identity are unchanged:
BF16 and FP8 checkpoints load into each other.

Every nn.Linear gets a recorded decision: converted, or skipped with a reason. The report says how many
were converted and why the rest were not, so "FP8 was on" never silently means "FP8 did nothing". Which layers
convert and the report are the rules every FP8 path shares (rules.py).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from cs336_basics.compiled import unwrap
from cs336_basics.config import FP8Config, RunConfig
from cs336_basics.errors import ConfigError
from cs336_basics.precision.converter import FP8Converter
from cs336_basics.precision.rules import (
    ORDER,
    FP8ConversionReport,
    check_keys_unchanged,
    check_model_ready,
    decide_conversions,
    module_filter,
)
from cs336_basics.precision.support import TORCHAO_INSTALL_HINT, import_torchao

if TYPE_CHECKING:
    from torchao.float8 import Float8LinearConfig

_DTYPE_NAMES = {torch.float8_e4m3fn: "E4M3", torch.float8_e5m2: "E5M2"}


def _torchao_float8() -> Any:
    """Import torchao.float8 lazily, so the rest of the package works (BF16 training) without torchao."""
    try:
        import_torchao()
        import torchao.float8 as ao_float8
    except Exception as exc:  # noqa: BLE001 - a broken install can raise more than ImportError
        raise ConfigError(
            f"FP8 training needs torchao, which is not importable here ({type(exc).__name__}: {exc}). "
            f"{TORCHAO_INSTALL_HINT}, or run without --use_fp8."
        ) from exc
    return ao_float8


def _float8_linear_class() -> type[nn.Module]:
    _torchao_float8()
    # Float8Linear is not re-exported by torchao.float8 (torchao calls it internal); it is the class
    # convert_to_float8_training swaps in, so it is the honest thing to count.
    from torchao.float8.float8_linear import Float8Linear

    return Float8Linear


# ---- our FP8Config -> torchao's Float8LinearConfig ----


def _with_grad_output_dtype(config: Float8LinearConfig, dtype: torch.dtype) -> Float8LinearConfig:
    # grad_output is cast in two GEMMs (grad_input and grad_weight) and torchao asserts both use one dtype,
    # so both cast configs change together. dataclasses.replace keeps each one's scaling type/granularity
    # and builds a new frozen instance, so torchao's __post_init__ checks run again on the result.
    return dataclasses.replace(
        config,
        cast_config_grad_output=dataclasses.replace(config.cast_config_grad_output, target_dtype=dtype),
        cast_config_grad_output_for_grad_weight=dataclasses.replace(
            config.cast_config_grad_output_for_grad_weight, target_dtype=dtype
        ),
    )


def torchao_float8_config(cfg: FP8Config, fsdp_float8_all_gather: bool = False) -> Float8LinearConfig:
    """torchao's Float8LinearConfig for our settings: the named recipe, then the format and emulation, and for a model
    FSDP2 will shard, FP8 all-gather of the weights (tensorwise only: torchao asserts it).

    fp8_format:
      auto   - the recipe's own dtypes: tensorwise is E4M3 input/weight + E5M2 grad_output (hybrid);
               rowwise and rowwise_with_gw_hp are E4M3 everywhere.
      hybrid - E4M3 forward, E5M2 gradients: tensorwise only (ConfigError for the rowwise recipes).
      e4m3   - E4M3 everywhere (for tensorwise this overrides grad_output; rowwise already is).
    """
    ao = _torchao_float8()
    config = ao.Float8LinearConfig.from_recipe_name(cfg.fp8_recipe)
    if cfg.fp8_format == "hybrid":
        if cfg.fp8_recipe != "tensorwise":
            # Not a kernel limit: an E5M2 grad_output with these recipes ran on torch 2.11 / H200. It is refused
            # because torchao defines and tests its rowwise recipes with E4M3 gradients only, and per-row scales
            # already give gradients the range that E5M2's extra exponent bit buys under one per-tensor scale.
            raise ConfigError(
                f"--fp8_format hybrid (E5M2 gradients) is not available with --fp8_recipe {cfg.fp8_recipe}: "
                "torchao's rowwise recipes keep grad_output in E4M3 by design (torchao/float8/config.py: 'e4m3 for "
                "activations, weights, gradients', with power-of-two per-row scales), because a scale per row "
                "already covers the gradients' dynamic range, which is what E5M2 is for under one per-tensor scale. "
                "Mixing E5M2 into them would be an untested recipe. Use --fp8_recipe tensorwise for hybrid, or keep "
                f"{cfg.fp8_recipe} with --fp8_format auto (or e4m3)."
            )
        config = _with_grad_output_dtype(config, torch.float8_e5m2)
    elif cfg.fp8_format == "e4m3":
        config = _with_grad_output_dtype(config, torch.float8_e4m3fn)
    if cfg.fp8_emulate:
        config = dataclasses.replace(config, emulate=True)
    if fsdp_float8_all_gather:
        # Each rank casts its weight shard to FP8 before the all-gather: half the bytes of a BF16 all-gather.
        config = dataclasses.replace(config, enable_fsdp_float8_all_gather=True)
    return config


def _dtype_name(dtype: torch.dtype) -> str:
    return _DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def describe_format(config: Float8LinearConfig, short: bool = False) -> str:
    """What the config actually casts to, read back from torchao's config (not from our flags)."""
    ao = _torchao_float8()
    fwd = _dtype_name(config.cast_config_input.target_dtype)
    grad = _dtype_name(config.cast_config_grad_output.target_dtype)
    hp_grad_weight = config.cast_config_grad_output_for_grad_weight.scaling_type is ao.ScalingType.DISABLED
    if short:
        text = f"{fwd} fwd / {grad} grad"
        return text + " (grad_weight in high precision)" if hp_grad_weight else text
    text = f"{fwd} forward / {grad} gradients"
    return text + " (grad_weight GEMM in high precision)" if hp_grad_weight else text


# ---- the conversion ----


def convert_model_to_fp8(model: nn.Module, cfg: FP8Config, fsdp_float8_all_gather: bool = False) -> FP8ConversionReport:
    """Swap the model's eligible nn.Linear layers for torchao Float8Linear, in place; report what happened.

    Converts whenever called (cfg.use_fp8 is the caller's switch). The model must be uncompiled, with
    every floating parameter in bfloat16 on CUDA (CPU allowed with cfg.fp8_emulate). Raises ConfigError
    when that order is broken, when torchao is missing, or when no layer would be converted.
    """
    # torchao import and format errors first, before touching the model
    config = torchao_float8_config(cfg, fsdp_float8_all_gather)
    ao = _torchao_float8()
    check_model_ready(model, cfg)
    already = count_float8_linears(model)
    if already:
        raise ConfigError(
            f"the model already has {already} Float8Linear layers; convert a model once, right after moving "
            f"it to CUDA + BF16 (order: {ORDER})."
        )

    report = float8_report(cfg, config)
    decide_conversions(model, cfg, report)

    keys_before = list(model.state_dict().keys())
    filter_fn = module_filter(cfg)
    ao.convert_to_float8_training(model, config=config, module_filter_fn=filter_fn)
    check_float8_conversion(model, report, keys_before, "torchao")
    return report


def float8_report(cfg: FP8Config, config: Float8LinearConfig, path: str = "torchao") -> FP8ConversionReport:
    """The empty report of a conversion to torchao's Float8Linear with `config` (TorchAO's path, Accelerate's)."""
    return FP8ConversionReport(
        recipe=cfg.fp8_recipe,
        format=describe_format(config),
        format_short=describe_format(config, short=True),
        emulate=cfg.fp8_emulate,
        path=path,
    )


def check_float8_conversion(model: nn.Module, report: FP8ConversionReport, keys_before: list[str], who: str) -> None:
    """The outcome of a conversion to Float8Linear checked independently of the filter that decided it: the swapped
    modules are the ones `report` names, and the state-dict keys are those from before (so that BF16 and FP8
    checkpoints load into each other)."""
    actual = float8_linear_names(model)
    if actual != report.converted:
        raise RuntimeError(
            f"{who} converted {len(actual)} layers but the filter approved {len(report.converted)}: "
            f"unexpected {sorted(set(actual) ^ set(report.converted))[:5]}"
        )
    check_keys_unchanged(model, keys_before)


def float8_linear_names(model: nn.Module) -> list[str]:
    """The names of the model's torchao Float8Linear modules, in torchao's traversal order."""
    Float8Linear = _float8_linear_class()  # noqa: N806
    return [name for name, m in model.named_modules(remove_duplicate=False) if isinstance(m, Float8Linear)]


def count_float8_linears(model: nn.Module) -> int:
    """Number of torchao Float8Linear modules in the model (a torch.compile wrapper is looked through)."""
    try:
        Float8Linear = _float8_linear_class()  # noqa: N806
    except ConfigError:
        return 0  # without torchao there can be no Float8Linear
    return sum(isinstance(m, Float8Linear) for _, m in unwrap(model).named_modules(remove_duplicate=False))


class TorchAOFP8(FP8Converter):
    """TorchAO's path (`--fp8_path torchao`): convert_to_float8_training swaps the linears for Float8Linear.
    `fsdp_float8_all_gather`: the model will be sharded by FSDP2, which then all-gathers FP8 weights."""

    path = "torchao"

    def __init__(self, fp8: FP8Config, world_size: int = 1, fsdp_float8_all_gather: bool = False):
        super().__init__(fp8, world_size)
        self.fsdp_float8_all_gather = fsdp_float8_all_gather
        self.model: nn.Module | None = None

    @classmethod
    def for_run(cls, config: RunConfig, world_size: int, fsdp_float8_all_gather: bool) -> TorchAOFP8:
        return cls(config.fp8, world_size, fsdp_float8_all_gather)

    @staticmethod
    def defaults(fp8: FP8Config, world_size: int, cuda_graphs: bool) -> tuple[str, dict[str, Any]]:
        # The shape rule is a speed rule for real FP8 GEMMs: emulation (numerics only) converts every layer.
        return "TorchAO's path's", {
            "fp8_lm_head": False,
            "fp8_shape_filter": not fp8.fp8_emulate,
            "fp8_scaling": "dynamic",
        }

    @staticmethod
    def check_options(fp8: FP8Config, world_size: int = 1) -> None:
        """Refuse, with the reason, the settings this path does not have."""
        fused_only = fp8.only_flags("fused")
        if fused_only:
            raise ConfigError(
                f"{', '.join(fused_only)} needs --fp8_path fused: TorchAO's path (torchao 0.18) has no delayed "
                "scaling (TorchAO removed it), no shared input casts or FP8 SwiGLU, and fast accumulation in its "
                "forward GEMM only. Drop the setting, or use --fp8_path fused (or auto)."
            )
        if fp8.fp8_all_gather and fp8.fp8_recipe != "tensorwise":
            raise ConfigError(
                f"--fp8_all_gather needs --fp8_recipe tensorwise: torchao 0.18 all-gathers FP8 weights with one "
                f"scale per tensor only (got --fp8_recipe {fp8.fp8_recipe}). Drop --fp8_all_gather (the weights "
                "are then all-gathered in BF16) or use the tensorwise recipe."
            )

    def convert(self, model: nn.Module) -> FP8ConversionReport:
        report = convert_model_to_fp8(model, self.fp8, fsdp_float8_all_gather=self.fsdp_float8_all_gather)
        self.model = model
        return report

    def count(self, model: nn.Module) -> int:
        return count_float8_linears(model)

    def after_optimizer_step(self) -> None:
        """With FP8 weight all-gather, every weight's FP8 scale computed once for the next forward (one all-reduce
        for all of them), as torchao documents for FSDP2."""
        if self.fsdp_float8_all_gather and self.model is not None:
            from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

            precompute_float8_dynamic_scale_for_fsdp(self.model)
