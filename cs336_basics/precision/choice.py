"""Which FP8 path a run takes, and the settings that follow from it: the one place the choice is made.

The default (`--fp8_path auto`) is the measured-best path wherever it runs: this package's fused path, with every
linear in FP8 including the lm_head, and delayed scaling in one process (benchmarks/results/INDEX.md has the runs).
TorchAO's path is chosen where only it runs or where it measured faster:
  - a rowwise recipe or --fp8_all_gather (the fused path is tensorwise and has no FP8 all-gather);
  - --fp8_emulate (emulation is TorchAO's; the fused path runs real FP8 casts even on the CPU);
  - FSDP2: on one rank of FSDP2 TorchAO's path measured faster (benchmarks/results/2026-11-23-fsdp-overheads-h200,
    item 5): the fused path's step is host-bound there.
  - DDP: on a first run TorchAO's path was ahead of BF16 (2026-11-23-sweep-1.3b-x2-h200x2) where the fused path
    fell behind it (issue #55's first runs); the fused path's non-graph step has lost host time since
    (2026-11-27-nongraph-host-time) but has not been measured under DDP again.
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
from typing import Any

from cs336_basics.config import FP8Config
from cs336_basics.errors import ConfigError
from cs336_basics.precision.accelerate import AccelerateFP8
from cs336_basics.precision.converter import Converter
from cs336_basics.precision.fp8 import TorchAOFP8
from cs336_basics.precision.fused.convert import FusedFP8

FP8_CONVERTERS = {"fused": FusedFP8, "torchao": TorchAOFP8, "accelerate": AccelerateFP8}
# The FP8 settings this module resolves when they are left automatic.
AUTO_SETTINGS = ("fp8_path", "fp8_lm_head", "fp8_shape_filter", "fp8_scaling", "fp8_fast_accum_backward")


@dataclass(frozen=True)
class FP8Choice:
    config: FP8Config  # every automatic setting resolved
    notes: tuple[str, ...]  # what was chosen and why, for the configuration summary


def choose_fp8(
    fp8: FP8Config,
    *,
    parallel_mode: str,
    world_size: int,
    lora: bool = False,
    own_model: bool = True,
    cuda_graphs: bool = False,
) -> FP8Choice:
    """Resolve fp8's automatic settings for a run in `parallel_mode` ("none", "ddp", "fsdp") on `world_size`
    processes. `lora`: a LoRA fine-tune, whose frozen base runs this package's own FP8 linears on either path, with
    defaults of its own (README, "Fine-tuning"), which depend on `cuda_graphs`: whether its FP8 step will replay under
    CUDA graphs. `own_model`: False for a Hugging Face model."""
    notes = []
    path = fp8.fp8_path
    if path == "auto":
        path, why = _auto_path(fp8, parallel_mode, own_model)
        other = "torchao" if path == "fused" else "fused" if own_model else "accelerate"
        notes.append(f"fp8_path={path} ({why}; another: --fp8_path {other})")
    if path == "fused" and not own_model:
        implied = fp8.implied_path()
        flags = f" ({', '.join(implied[1])} named it)" if implied and fp8.fp8_path == "auto" else ""
        raise ConfigError(
            f"the fused FP8 path{flags} converts this package's model only, not a Hugging Face model; use "
            "--fp8_path torchao (or accelerate) and drop the fused path's settings."
        )
    whose, defaults = _defaults(fp8, path, world_size, lora, cuda_graphs)
    changes = {"fp8_path": path}
    changes |= {name: value for name, value in defaults.items() if getattr(fp8, name) in (None, "auto")}
    automatic = [f"{name}={value}" for name, value in changes.items() if name != "fp8_path"]
    if automatic:
        notes.append(f"{', '.join(automatic)} ({whose} defaults)")
    chosen = dataclasses.replace(fp8, **changes)
    if not lora:  # a LoRA base runs its own FP8 linears, which take either path's settings
        FP8_CONVERTERS[path].check_options(chosen, world_size)
    return FP8Choice(chosen, tuple(notes))


def fp8_converter(fp8: FP8Config, world_size: int = 1, fsdp_float8_all_gather: bool = False) -> Converter:
    """The converter of the path a chosen FP8Config names (choose_fp8's result: no "auto" left).
    `fsdp_float8_all_gather`: the model will be sharded by FSDP2, which then all-gathers FP8 weights (TorchAO's)."""
    if fp8.fp8_path == "fused":  # its check_options refuses --fp8_all_gather, which fsdp_float8_all_gather needs
        return FusedFP8(fp8, world_size)
    if fp8.fp8_path == "torchao":
        return TorchAOFP8(fp8, fsdp_float8_all_gather)
    if fp8.fp8_path == "accelerate":
        return AccelerateFP8(fp8, world_size)
    raise ValueError(f"fp8_converter takes a chosen FP8Config (choose_fp8), not fp8_path={fp8.fp8_path!r}")


def _defaults(fp8: FP8Config, path: str, world_size: int, lora: bool, cuda_graphs: bool) -> tuple[str, dict[str, Any]]:
    """Whose defaults apply, and the lm_head, shape-rule, scaling and backward-accumulation settings they give (the
    last only where this package's FP8 linears run: TorchAO's and Accelerate's take no such setting)."""
    if lora:  # measured on a LoRA base (docs/fine-tuning.md): delayed scaling pays only under CUDA graphs, where
        # it was measured with the FP8 head (benchmarks/results/2026-11-26-defaults-by-block/README.md, item 3).
        # Fast accumulation in the input-gradient GEMMs (a frozen base has no other backward GEMM) paid on both GPUs
        # and kept the fine-tune's loss (benchmarks/results/2026-11-27-lora-defaults-both-gpus/README.md, items 1, 4).
        either = {"fp8_shape_filter": False, "fp8_fast_accum_backward": True}
        if cuda_graphs:
            return "a LoRA base's under CUDA graphs", {"fp8_lm_head": True, "fp8_scaling": "delayed", **either}
        return "a LoRA base's", {"fp8_lm_head": False, "fp8_scaling": "dynamic", **either}
    if path == "fused":  # one amax history per process, which several processes would not agree on: dynamic there.
        # Fast backward accumulation moved pre-training's loss (docs/fp8.md): off until a loss check says otherwise.
        scaling = "delayed" if world_size == 1 else "dynamic"
        return "the fused path's", {
            "fp8_lm_head": True,
            "fp8_shape_filter": False,
            "fp8_scaling": scaling,
            "fp8_fast_accum_backward": False,
        }
    if path == "accelerate":  # its own filter decides which linears convert (precision/accelerate.py)
        return "Accelerate's", {"fp8_lm_head": False, "fp8_shape_filter": False, "fp8_scaling": "dynamic"}
    # The shape rule is a speed rule for real FP8 GEMMs: emulation (numerics only) converts every layer.
    return "TorchAO's path's", {"fp8_lm_head": False, "fp8_shape_filter": not fp8.fp8_emulate, "fp8_scaling": "dynamic"}


def _auto_path(fp8: FP8Config, parallel_mode: str, own_model: bool) -> tuple[str, str]:
    implied = fp8.implied_path()
    if implied:
        path, flags = implied
        return path, f"{', '.join(flags)} needs it"
    if not own_model:
        return "torchao", "the fused path converts this package's model only"
    if fp8.fp8_emulate:
        return "torchao", "--fp8_emulate is TorchAO's emulation"
    if parallel_mode == "fsdp":
        return "torchao", "measured faster under FSDP2"
    if parallel_mode == "ddp":
        return "torchao", "measured faster under DDP on a first run"
    return "fused", "measured fastest"
