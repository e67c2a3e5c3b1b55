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
from cs336_basics.precision.support import FP8Support, check_fp8_support, require_fp8

__all__ = [
    "FP8ConversionReport",
    "FP8Support",
    "check_fp8_support",
    "check_fp8_tokens",
    "convert_model_to_fp8",
    "count_float8_linears",
    "describe_format",
    "fp8_gemm_pays",
    "grad_weight_in_fp8",
    "module_filter",
    "require_fp8",
    "skip_reason",
    "torchao_float8_config",
]
