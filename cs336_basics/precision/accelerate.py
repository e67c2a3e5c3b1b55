"""Accelerate's FP8 path (`--fp8_path accelerate`): the conversion a Hugging Face user gets from
`Accelerator(mixed_precision="fp8", kwargs_handlers=[AORecipeKwargs(config=...)])`, Accelerate's TorchAO backend,
applied to any model here so that it is measured beside the other paths with the same model, batch and loop.

`accelerator.prepare(model)` does to the model what it does for such a user: TorchAO's convert_to_float8_training
with Accelerate's default filter (every nn.Linear with both dims divisible by 16 but the model's first and last in
module order: accelerate/utils/ao.py, `find_first_last_linear_layers`), then wraps its forward in a BF16 autocast
whose outputs it casts to float32 (the native AMP Accelerate turns on for fp8). The optimizer (fp32 master weights),
the training loop and torch.compile stay this package's, the same for every path, so a comparison isolates what the
path does to the model. Needs the hf extra (accelerate).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from cs336_basics.config import FP8Config
from cs336_basics.errors import ConfigError
from cs336_basics.precision.converter import FP8Converter
from cs336_basics.precision.fp8 import (
    check_float8_conversion,
    count_float8_linears,
    float8_report,
    torchao_float8_config,
)
from cs336_basics.precision.rules import (
    SKIP_NOT_16,
    FP8ConversionReport,
    check_model_ready,
    dims_divisible_by_16,
    file_decisions,
    nothing_converted_error,
)
from cs336_basics.precision.support import HF_INSTALL_HINT

SKIP_FIRST_LAST = "Accelerate's default filter: the model's first or last nn.Linear"


def first_and_last_linear(model: nn.Module) -> tuple[str, ...]:
    """The names of the model's first and last nn.Linear in module order (what Accelerate's filter keeps)."""
    names = [fqn for fqn, m in model.named_modules() if isinstance(m, nn.Linear)]
    return (names[0], names[-1]) if names else ()


def accelerate_skip_rule(model: nn.Module) -> Callable[[nn.Module, str], tuple[str, str] | None]:
    """Accelerate's default filter for `model` as a skip rule: (category, reason) for a linear it keeps in BF16."""
    first_last = first_and_last_linear(model)

    def skip(module: nn.Module, fqn: str) -> tuple[str, str] | None:
        if not isinstance(module, nn.Linear):
            return "not an nn.Linear", "not an nn.Linear"
        if not dims_divisible_by_16(module, fqn):
            return SKIP_NOT_16, f"{SKIP_NOT_16} (in_features={module.in_features}, out_features={module.out_features})"
        return (SKIP_FIRST_LAST, SKIP_FIRST_LAST) if fqn in first_last else None

    return skip


def _require_accelerate() -> Any:
    try:
        import accelerate
        from accelerate.utils import AORecipeKwargs  # noqa: F401 - Accelerate 1.4+: its TorchAO backend
    except ImportError as exc:
        raise ConfigError(
            f"--fp8_path accelerate needs Hugging Face Accelerate (1.10+, for AORecipeKwargs): {HF_INSTALL_HINT}."
        ) from exc
    return accelerate


class AccelerateFP8(FP8Converter):
    """Accelerate's TorchAO backend, as `accelerator.prepare` applies it (the module docstring says what it does)."""

    path = "accelerate"

    @staticmethod
    def defaults(fp8: FP8Config, world_size: int, cuda_graphs: bool) -> tuple[str, dict[str, Any]]:
        # Its own filter decides which linears convert (first_and_last_linear).
        return "Accelerate's", {"fp8_lm_head": False, "fp8_shape_filter": False, "fp8_scaling": "dynamic"}

    @staticmethod
    def check_options(fp8: FP8Config, world_size: int = 1) -> None:
        """Refuse, with the reason, the settings Accelerate's conversion does not have."""
        others = fp8.only_flags("fused") + fp8.only_flags("torchao")
        if others:
            raise ConfigError(
                f"{', '.join(others)}: not a setting of Accelerate's FP8 (its TorchAO backend converts with TorchAO's "
                "recipe and Accelerate's filter). Drop it, or use --fp8_path fused or torchao."
            )
        if fp8.fp8_lm_head or fp8.fp8_shape_filter:
            flag = "--fp8_lm_head" if fp8.fp8_lm_head else "--fp8_shape_filter"
            raise ConfigError(
                f"{flag}: Accelerate's default filter decides which linears convert (all but the first and the last, "
                "the lm_head among them). Drop the flag, or use --fp8_path torchao for this package's filters."
            )
        if world_size > 1:
            raise ConfigError(
                "--fp8_path accelerate runs in one process: several processes are Accelerate's own launcher's "
                "(accelerate launch), not torchrun's. Start it without torchrun."
            )

    def convert(self, model: nn.Module) -> FP8ConversionReport:
        accelerate = _require_accelerate()
        from accelerate.utils import AORecipeKwargs

        config = torchao_float8_config(self.fp8)
        check_model_ready(model, self.fp8)
        report = float8_report(self.fp8, config, path="accelerate")
        file_decisions(model, accelerate_skip_rule(model), report)
        if not report.converted:
            raise nothing_converted_error(report)
        device = next(model.parameters()).device
        accelerator = accelerate.Accelerator(
            mixed_precision="fp8", cpu=device.type == "cpu", kwargs_handlers=[AORecipeKwargs(config=config)]
        )
        if accelerator.device.type != device.type:  # its autocast would be for the other device
            raise ConfigError(
                f"Accelerate's state in this process was set up for {accelerator.device} and the model is on "
                f"{device}: Accelerate keeps one state per process. Convert this model in a fresh process."
            )
        # The model stays where the build stage put it; Accelerate converts it in place and wraps its forward.
        keys_before = list(model.state_dict().keys())
        if accelerator.prepare(model, device_placement=[False]) is not model:
            raise RuntimeError("Accelerate's prepare returned another module than the model it converts in place")
        # A mismatch would mean this Accelerate's filter is not the one accelerate_skip_rule describes.
        check_float8_conversion(model, report, keys_before, "Accelerate")
        return report

    def count(self, model: nn.Module) -> int:
        return count_float8_linears(model)
