"""Reduced-precision training: FP8 support checks and TorchAO float8 conversion.

Order: create model -> move to CUDA + BF16 -> `require_fp8` + `convert_model_to_fp8` -> torch.compile.
"""

from cs336_basics.precision.fp8 import (
    FP8ConversionReport,
    check_fp8_tokens,
    convert_model_to_fp8,
    count_float8_linears,
    describe_format,
    fp8_gemm_pays,
    grad_weight_in_fp8,
    module_filter,
    skip_reason,
    torchao_float8_config,
)
from cs336_basics.precision.support import FP8Support, check_fp8_support, require_fp8, require_fp8_gpu


def convert_for_fp8(model, cfg, fsdp_float8_all_gather: bool = False) -> FP8ConversionReport:
    """Convert `model` to FP8 by the path cfg.fp8_path names: "torchao" (Float8Linear) or "fused" (ours).
    `fsdp_float8_all_gather`: the model will be sharded by FSDP2, which then all-gathers FP8 weights (torchao only;
    the plan refuses FSDP2 with the fused path)."""
    if cfg.fp8_path == "auto":
        raise ValueError(
            "convert_for_fp8 takes a resolved FP8Config: build.plan chooses the path (precision/choice.py)"
        )
    if cfg.fp8_path == "fused":
        if fsdp_float8_all_gather:
            raise ValueError("the fused FP8 path has no FSDP2 all-gather (the plan refuses this combination)")
        from cs336_basics.precision.fused.convert import convert_model_to_fused_fp8

        return convert_model_to_fused_fp8(model, cfg)
    return convert_model_to_fp8(model, cfg, fsdp_float8_all_gather=fsdp_float8_all_gather)


def count_fp8_linears(model) -> int:
    """Linear layers whose GEMMs run in FP8, counted from the model's modules (independently of any conversion
    report): TorchAO's Float8Linear and the fused path's FP8 linears."""
    from cs336_basics.precision.fused.convert import count_fused_linears

    return count_float8_linears(model) + count_fused_linears(model)


__all__ = [
    "FP8ConversionReport",
    "FP8Support",
    "check_fp8_support",
    "check_fp8_tokens",
    "convert_for_fp8",
    "convert_model_to_fp8",
    "count_float8_linears",
    "count_fp8_linears",
    "describe_format",
    "fp8_gemm_pays",
    "grad_weight_in_fp8",
    "module_filter",
    "require_fp8",
    "require_fp8_gpu",
    "skip_reason",
    "torchao_float8_config",
]
