"""Prove that FP8 is really applied and really pays on this machine: conversion count, FP8 GEMMs in the profiler,
no graph breaks, FP8 loss close to BF16, and FP8 + compile vs BF16 + compile tokens/s side by side.

    uv run verify_fp8_compilation.py                   # the 366M shape on a GPU; a small emulated check on CPU
    uv run verify_fp8_compilation.py --json out.json   # also write the checks, the runs and the findings as JSON
    uv run verify_fp8_compilation.py --init_from runs/default --lora_rank 16 --lora_targets attn   # a LoRA fine-tune
    uv run --extra hf verify_fp8_compilation.py --hf_model llama-1b --batch_size 4   # a Hugging Face causal LM

After the checks it shows this package's other FP8 path beside the chosen one (--no_compare_paths: not), and says
why FP8 is as fast as it is: what each conversion policy would convert, on a GPU the Amdahl prediction (the
converted GEMMs' share of the BF16 step x their FP8 speed) beside the measured ratio, and findings, each with the
number it measured and what to do. --hf_model takes a named shape (llama-tiny, llama-125m,
llama-1b), a local directory with a config.json or a hub id; the model gets random weights.

For a LoRA fine-tune the FP8 base is frozen (weights cast once, no weight-gradient GEMM), and the checks say so: the
frozen FP8 linears against the LoRA report (whose summary is printed first), the FP8 GEMMs of one eager step (1 to 2
per FP8 linear, none for a weight gradient) and, on a GPU, as many in the compiled step; gradients on the adapters
alone (no_base_weight_gradients); every FP8 base weight cast once (base_fp8_weights_cast_once); then graph breaks,
loss and speed against the same fine-tune on a BF16 base. On CPU the base runs torch._scaled_mm's CPU kernels, not
emulation (--fp8_emulate is refused for a LoRA run).

Takes the same model/data/FP8/fine-tuning flags as train_h100.py. Exits 1 if any check FAILs (or --json could not be
written), 2 on a configuration error.
"""

from __future__ import annotations

import dataclasses
import math
import sys

from cs336_basics.cli import config_from_args, config_parser, load_config_file, overrides_from_args
from cs336_basics.errors import ConfigError, run_program, writing
from cs336_basics.measure.results import check_results_file, write_results
from cs336_basics.parallel.world import torchrun_world
from cs336_basics.programs.verify_fp8 import LOSS_TOLERANCE, MIN_SPEEDUP, verify_fp8


def main(argv: list[str] | None = None) -> int:
    parser = config_parser(__doc__)
    parser.add_argument("--steps", type=int, default=50, help="training steps per precision (default 50)")
    parser.add_argument(
        "--loss_tolerance", type=float, default=LOSS_TOLERANCE,
        help=f"max relative FP8-BF16 loss gap (default {LOSS_TOLERANCE})",
    )  # fmt: skip
    parser.add_argument(
        "--min_speedup", type=float, default=MIN_SPEEDUP,
        help=f"FP8/BF16 tokens/s needed to PASS (default {MIN_SPEEDUP})",
    )  # fmt: skip
    parser.add_argument("--json", help="write the checks, the runs and the doctor's findings here")
    parser.add_argument(
        "--no_compare_paths", dest="compare_paths", action="store_false",
        help="this package's model: train only the chosen FP8 path (by default the other, fused or TorchAO's, too)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    return run_program(lambda: _verify(args))


# Trainer flags this tool cannot honour (it trains each precision in memory, in one process, for --steps steps), each
# with what to do instead.
_NO_RUN_FOLDER = "it writes no run folder; to keep its results, pass --json FILE"
_NOT_HERE = {
    ("fp8", "use_fp8"): (False, "it compares FP8 with BF16: without FP8 there is nothing to verify"),
    ("train", "resume"): (True, _NO_RUN_FOLDER),
    ("train", "overwrite"): (True, _NO_RUN_FOLDER),
    ("train", "out_dir"): (None, _NO_RUN_FOLDER),
    ("train", "max_steps"): (None, "its steps per precision are --steps"),
}


# Trainer flags it leaves unused (it neither evaluates nor checkpoints, logs its own way, runs one process): said in a
# note, not refused, so that a run's flags can be passed on as they are.
_UNUSED_HERE = (
    "eval_every", "eval_batches", "checkpoint_every", "log_every", "ddp_bucket_mb", "dist_timeout_s",
    "fsdp_blocks_per_unit", "fsdp_reshard_after_forward",
)  # fmt: skip


def _check_request(args) -> None:
    """Refuse, before any work, what this tool would otherwise ignore or cannot verify: as flags, or in a --config
    file, where a run folder's config.json names its out_dir and max_steps, which are said to be unused instead."""
    if torchrun_world() is not None:
        raise ConfigError("verify_fp8_compilation.py runs in one process: start it without torchrun.")
    layers = [("", overrides_from_args(args))]
    if args.config:
        layers.append((f"{args.config}: its ", load_config_file(args.config)))
    unused = []
    for where, layer in layers:
        for (section, name), (refused, why) in _NOT_HERE.items():
            value = layer.get(section, {}).get(name)
            if value is None or (refused is not None and value != refused):
                continue
            if where and refused is None:  # a run's own settings, harmless here
                unused.append(name)
                continue
            flag = f"--{name}" if value is not False else f"--no_{name}"
            raise ConfigError(f"verify_fp8_compilation.py does not take {where}{flag}: {why}.")
        if layer.get("train", {}).get("parallel", "auto") != "auto":
            raise ConfigError(f"verify_fp8_compilation.py runs in one process: drop {where}--parallel.")
    typed = layers[0][1].get("train", {})
    flags = [f"--{name}" for name in _UNUSED_HERE if typed.get(name) is not None]
    if flags:
        print(f"note: {', '.join(flags)} not used here: it trains each precision in one process, unevaluated")
    if unused:
        print(f"note: {args.config}'s {', '.join(unused)} are not used here (each precision trains --steps steps)")
    if args.steps < 1:
        raise ConfigError(f"--steps must be >= 1; got {args.steps}.")
    if (
        not (math.isfinite(args.loss_tolerance) and math.isfinite(args.min_speedup))
        or min(args.loss_tolerance, args.min_speedup) < 0
    ):
        raise ConfigError(
            f"--loss_tolerance and --min_speedup must be finite and >= 0; got {args.loss_tolerance:g} and "
            f"{args.min_speedup:g}."
        )


def _verify(args) -> int:
    _check_request(args)
    if args.json is not None:  # before the verification's minutes, not after them; an earlier report is replaced
        check_results_file(args.json, "--json", fix="Name a new file, or an earlier --json report to replace.")
    config = config_from_args(args)
    train = dataclasses.replace(config.train, max_steps=args.steps, log_every=min(10, args.steps))
    result = verify_fp8(
        dataclasses.replace(config, train=train),
        args.loss_tolerance,
        args.min_speedup,
        compare_paths=args.compare_paths,
    )
    print(result.table())
    skipped = [c.name for c in result.checks if c.status == "SKIP"]
    if not result.passed:
        print("SOME CHECKS FAILED")
    elif skipped:
        print(f"EVERY CHECK THAT RAN PASSED; skipped here: {', '.join(skipped)} (their reasons are in the table)")
    else:
        print("ALL CHECKS PASSED")
    if args.json is not None:
        with writing(args.json, "The checks ran and their table is printed above."):
            write_results(args.json, result.runs, **result.to_dict())
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
