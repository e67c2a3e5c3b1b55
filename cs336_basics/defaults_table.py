"""What `auto` gives in each way a user trains, with the record each row rests on: the README's table.

The choices are not written here a second time: each row asks the functions build.plan calls (compiled.py's
auto_compile_mode and auto_compile_wrapper, precision/choice.choose_fp8) what they choose for that mode, so the table
cannot part from what a run does, and tests/test_defaults_table.py holds the README's copy to it. Each mode names the
study that measured its default against BF16 (benchmarks/results/INDEX.md gives the numbers).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

# The LoRA mode's FP8 defaults are its converter's, which registers itself when lora/ is imported.
import cs336_basics.lora  # noqa: F401
from cs336_basics.compiled import auto_compile_mode, auto_compile_wrapper, runs_cuda_graphs
from cs336_basics.config import FP8Config, TrainConfig
from cs336_basics.parallel.world import SINGLE, World
from cs336_basics.precision.choice import choose_fp8

RESULTS = "benchmarks/results"


@dataclass(frozen=True)
class Mode:
    """One way of training, as its flags set it, and the record that measured its default FP8 against BF16."""

    name: str
    record: str  # a study under benchmarks/results/
    world_size: int = 1
    parallel: str = "none"  # as resolved for the run: none, ddp, fsdp
    accumulation: int = 1
    compile_mode: str = "auto"
    lora: bool = False


MODES = (
    Mode("one GPU", "2026-11-27-pretrain-joint-dgrad-both-gpus"),
    Mode("one GPU, `--gradient_accumulation_steps 4`", "2026-11-27-graph-accumulation", accumulation=4),
    Mode("one GPU, `--compile_mode default`", "2026-11-28-cpp-wrapper", compile_mode="default"),
    Mode("DDP (torchrun)", "2026-11-28-ddp-delayed-4xh200", world_size=2, parallel="ddp"),
    Mode(
        "DDP, `--gradient_accumulation_steps 4`",
        "2026-11-28-ddp-delayed-4xh200",
        world_size=2,
        parallel="ddp",
        accumulation=4,
    ),
    Mode(
        "FSDP2 (torchrun, `--parallel fsdp`)", "2026-11-29-fsdp2-graphs-default-x2-h200", world_size=2, parallel="fsdp"
    ),
    Mode("LoRA on an FP8 base, one GPU", "2026-11-27-lora-joint-dgrad-both-gpus", lora=True),
)


def choices(mode: Mode) -> tuple[str, str]:
    """(compile mode and wrapper, FP8 settings) that auto gives an FP8 run of this package's model on a CUDA GPU in
    `mode`."""
    world = SINGLE if mode.world_size == 1 else World(world_size=mode.world_size, launched=True)
    train = dataclasses.replace(
        TrainConfig(), compile_model=True, compile_mode=mode.compile_mode,
        gradient_accumulation_steps=mode.accumulation,
    )  # fmt: skip
    cuda = torch.device("cuda")
    compile_mode = mode.compile_mode
    if compile_mode == "auto":
        compile_mode, _ = auto_compile_mode(train, True, cuda, mode.parallel)
    chosen = choose_fp8(
        FP8Config(use_fp8=True), world_size=mode.world_size, lora=mode.lora,
        cuda_graphs=runs_cuda_graphs(True, compile_mode, cuda),
    ).config  # fmt: skip
    head = "FP8 head" if chosen.fp8_lm_head else "BF16 head"
    shapes = "its shape rule" if chosen.fp8_shape_filter else "every linear"
    fp8 = f"{chosen.fp8_path}, {chosen.fp8_scaling} scaling, {shapes}, {head}"
    train = dataclasses.replace(train, compile_mode=compile_mode)
    wrapper, _ = auto_compile_wrapper(train, cuda, world, mode.parallel, chosen.fp8_path)
    return f"`{compile_mode}`" + (", C++ wrapper" if wrapper == "cpp" else ""), fp8


def markdown() -> str:
    """The README's table: one row per mode."""
    rows = ["| mode | compile mode | FP8 path and settings | measured in |", "|---|---|---|---|"]
    for mode in MODES:
        compile_mode, fp8 = choices(mode)
        link = f"[{mode.record}]({RESULTS}/{mode.record}/)"
        rows.append(f"| {mode.name} | {compile_mode} | {fp8} | {link} |")
    return "\n".join(rows)
