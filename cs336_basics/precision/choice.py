"""Which FP8 path a run takes, and the settings that follow from it: the one place the choice is made.

The default (`--fp8_path auto`) is the measured-best path wherever it runs: this package's fused path, with every
linear in FP8 including the lm_head, and delayed scaling (benchmarks/results/INDEX.md has the runs). Under DDP too:
on first runs on 2 GPUs at 1.3b it ran ahead of TorchAO's path with CUDA graphs and without them, and with gradient
accumulation (2026-11-28-ddp-levers-4xh200); its delayed scaling ran ahead of its dynamic scaling on 2 and 4 GPUs
(2026-11-28-ddp-delayed-4xh200).
Under FSDP2 too: there, on first runs on 2 GPUs at 1.3b, the fused path ran ahead of TorchAO's, both behind BF16
(2026-11-28-fsdp2-x2-h200); with inductor's C++ wrapper, which auto gives it there, it came near BF16, and TorchAO's
path took less memory per GPU (2026-11-28-fsdp2-cpp-wrapper-x2-h200); under CUDA graphs, auto's compile mode there
without accumulation, it ran well ahead of BF16 (2026-11-29-fsdp2-graphs-default-x2-h200; TorchAO's path under
graphs is not measured on several GPUs).
TorchAO's path is chosen where only it runs:
  - a rowwise recipe or --fp8_all_gather (the fused path is tensorwise and has no FP8 all-gather);
  - --fp8_emulate (emulation is TorchAO's; the fused path runs real FP8 casts even on the CPU).
The modes and what auto gives in each, with their records: defaults_table.py (the README's table).
A Hugging Face model (--hf_model) takes TorchAO's path: the fused path converts this package's model only.
`--fp8_path accelerate` is never chosen automatically: it is there to measure what Accelerate's FP8 gives.
A setting given explicitly is kept; a setting that only one path has picks that path, and the chosen path's converter
refuses, with the reason, a setting it does not have. The result is concrete (no "auto" left) and its notes are the
summary's "auto-selected" words. A run folder's config.json keeps the request
(AUTO_SETTINGS as asked, like --parallel auto), so a resumed run chooses again: the same choice on the same launch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from cs336_basics.config import LORA_FP8_PATH, FP8Config, RunConfig
from cs336_basics.errors import ConfigError
from cs336_basics.precision.accelerate import AccelerateFP8
from cs336_basics.precision.converter import NO_CONVERSION, Converter, FP8Converter
from cs336_basics.precision.fp8 import TorchAOFP8
from cs336_basics.precision.fused.convert import FusedFP8

# Every FP8 implementation, by its name. A LoRA fine-tune's frozen base registers its own (lora/apply.py) from above
# this package, whose modules it uses.
FP8_CONVERTERS: dict[str, type[FP8Converter]] = {c.path: c for c in (FusedFP8, TorchAOFP8, AccelerateFP8)}
# The FP8 settings this module resolves when they are left automatic.
AUTO_SETTINGS = ("fp8_path", "fp8_lm_head", "fp8_shape_filter", "fp8_scaling", "fp8_fast_accum_backward")


@dataclass(frozen=True)
class FP8Choice:
    config: FP8Config  # every automatic setting resolved
    notes: tuple[str, ...]  # what was chosen and why, for the configuration summary


def choose_fp8(
    fp8: FP8Config,
    *,
    world_size: int,
    lora: bool = False,
    own_model: bool = True,
    cuda_graphs: bool = False,
) -> FP8Choice:
    """Resolve fp8's automatic settings for a run on `world_size` processes (in one process, under DDP or FSDP2
    alike: the paths measured in the same order in each). `lora`: a LoRA fine-tune, whose frozen base runs this
    package's own FP8 linears on either path, with defaults of its own (README, "Fine-tuning"), which depend on
    `cuda_graphs`: whether its FP8 step will replay under CUDA graphs. `own_model`: False for a Hugging Face model."""
    notes = []
    path = fp8.fp8_path
    if path == "auto":
        path, why = _auto_path(fp8, own_model)
        other = "torchao" if path == "fused" else "fused" if own_model else "accelerate"
        notes.append(f"fp8_path={path} ({why}; another: --fp8_path {other})")
    if path == "fused" and not own_model:
        implied = fp8.implied_path()
        flags = f" ({', '.join(implied[1])} named it)" if implied and fp8.fp8_path == "auto" else ""
        raise ConfigError(
            f"the fused FP8 path{flags} converts this package's model only, not a Hugging Face model; use "
            "--fp8_path torchao (or accelerate) and drop the fused path's settings."
        )
    implementation = fp8_implementation(LORA_FP8_PATH if lora else path)
    whose, defaults = implementation.defaults(fp8, world_size, cuda_graphs)
    changes = {"fp8_path": path}
    changes |= {name: value for name, value in defaults.items() if getattr(fp8, name) in (None, "auto")}
    automatic = [f"{name}={value}" for name, value in changes.items() if name != "fp8_path"]
    if automatic:
        notes.append(f"{', '.join(automatic)} ({whose} defaults)")
    chosen = dataclasses.replace(fp8, **changes)
    implementation.check_options(chosen, world_size)
    return FP8Choice(chosen, tuple(notes))


def register_fp8_converter(converter: type[FP8Converter]) -> type[FP8Converter]:
    """Register an FP8 implementation under its name (`converter.path`)."""
    FP8_CONVERTERS[converter.path] = converter
    return converter


def fp8_implementation(name: str) -> type[FP8Converter]:
    """The FP8 implementation registered as `name`: a concrete FP8 path (choose_fp8's result: no "auto" left) or a
    LoRA base's."""
    if name not in FP8_CONVERTERS:
        raise ValueError(
            f"no FP8 implementation is registered as {name!r} (registered: {', '.join(FP8_CONVERTERS)}); a LoRA "
            "base's registers when cs336_basics.lora is imported"
        )
    return FP8_CONVERTERS[name]


def run_converter(config: RunConfig, world_size: int = 1, fsdp_float8_all_gather: bool = False) -> Converter:
    """The converter of a planned run (choose_fp8 resolved its FP8 settings): a LoRA fine-tune's, whose frozen base
    runs in FP8 or BF16; else the FP8 path's; else none. `fsdp_float8_all_gather`: the model will be sharded by FSDP2,
    which then all-gathers FP8 weights (TorchAO's)."""
    if config.finetune.lora:
        name = LORA_FP8_PATH
    elif config.fp8.use_fp8:
        name = config.fp8.fp8_path
    else:
        return NO_CONVERSION
    return fp8_implementation(name).for_run(config, world_size, fsdp_float8_all_gather)


def _auto_path(fp8: FP8Config, own_model: bool) -> tuple[str, str]:
    implied = fp8.implied_path()
    if implied:
        path, flags = implied
        return path, f"{', '.join(flags)} needs it"
    if not own_model:
        return "torchao", "the fused path converts this package's model only"
    if fp8.fp8_emulate:
        return "torchao", "--fp8_emulate is TorchAO's emulation"
    return "fused", "measured fastest"
