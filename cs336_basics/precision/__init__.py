"""Reduced-precision training: one Converter per way a model's linears change precision (converter.py: what the build
stage and the Trainer need of any of them), the path chosen in one place (choice.py), TorchAO's float8 path (fp8.py),
the filters, report and checks every FP8 path shares (rules.py), this package's fused path (fused/), and the FP8 support
checks (support.py). A LoRA fine-tune's frozen base is converted by lora/apply.py's LoRAConverter, registered with the
FP8 paths (choice.FP8_CONVERTERS) under its own name.

Order: create model -> move to CUDA + BF16 -> plan's `choose_fp8` + `require_fp8` -> the converter's convert, then
its count -> torch.compile.
"""

from cs336_basics.precision.choice import AUTO_SETTINGS, FP8Choice, choose_fp8, run_converter
from cs336_basics.precision.converter import NO_CONVERSION, Converter
from cs336_basics.precision.fp8 import (
    TorchAOFP8,
    convert_model_to_fp8,
    count_float8_linears,
    describe_format,
    torchao_float8_config,
)
from cs336_basics.precision.fused.convert import FusedFP8
from cs336_basics.precision.rules import (
    FP8ConversionReport,
    check_fp8_tokens,
    fp8_gemm_pays,
    grad_weight_in_fp8,
    module_filter,
    skip_reason,
)
from cs336_basics.precision.support import FP8Support, check_fp8_support, require_fp8, require_fp8_gpu

__all__ = [
    "AUTO_SETTINGS",
    "NO_CONVERSION",
    "Converter",
    "FP8Choice",
    "FP8ConversionReport",
    "FP8Support",
    "FusedFP8",
    "TorchAOFP8",
    "check_fp8_support",
    "check_fp8_tokens",
    "choose_fp8",
    "convert_model_to_fp8",
    "count_float8_linears",
    "describe_format",
    "fp8_gemm_pays",
    "grad_weight_in_fp8",
    "module_filter",
    "require_fp8",
    "require_fp8_gpu",
    "run_converter",
    "skip_reason",
    "torchao_float8_config",
]
