"""The command line every step probe shares (host_time, memory_peak): which presets and precisions to build, where
the JSON goes, and one frame that refuses a machine without CUDA or an unknown choice before any work, then writes
the records; and what each probe measures, a preset warmed up. Under torchrun each rank measures (the collectives need
every rank) and rank 0 writes the records."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from cs336_basics.build import Built, build
from cs336_basics.config import TrainConfig
from cs336_basics.config_layers import build_config
from cs336_basics.devices import require_cuda
from cs336_basics.diagnostics.measurement import train_for_measurement
from cs336_basics.errors import ConfigError, report_error
from cs336_basics.measure.results import write_results
from cs336_basics.parallel.world import process_group
from cs336_basics.sweep.plan import parse_choices
from cs336_basics.training.trainer import Trainer

PROBE_PRECISIONS = ("bf16", "fp8")  # what warmed_up_preset builds: BF16, or the default FP8 path


def probe_parser(module: str, doc: str | None) -> argparse.ArgumentParser:
    """A probe's parser with the arguments all probes take: --presets, --precisions, --json."""
    parser = argparse.ArgumentParser(
        prog=f"python -m {module}", description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--presets", default="gpt2-small", help="comma-separated presets")
    parser.add_argument("--precisions", default="bf16,fp8", help="bf16, fp8 (the default FP8 path), comma-separated")
    parser.add_argument("--json", help="write {gpu, torch, torchao, command, runs} here")
    return parser


Record = dict[str, Any]


def run_probe(
    args: argparse.Namespace,
    what: str,
    why: str,
    measure_all: Callable[[list[str], list[str]], Iterable[Record]],
    describe: Callable[[Record], str],
) -> int:
    """The records `measure_all(presets, precisions)` yields, after the checks (a ConfigError it raises is reported the
    same way): each, as soon as it is measured, is printed as `describe` gives it and added to --json, which holds
    every record so far: a probe stopped part way (a time limit, a crash in a later configuration) keeps what it
    finished. Under torchrun rank 0 prints and writes. The exit code."""
    runs = []
    try:
        require_cuda(what, why)
        precisions = parse_choices(args.precisions, PROBE_PRECISIONS, "--precisions")
        with process_group("cuda", TrainConfig().dist_timeout_s) as world:
            for record in measure_all(args.presets.split(","), precisions):
                if world.rank:
                    continue
                runs.append(record)
                if args.json:
                    write_results(args.json, runs)
                print(describe(record), flush=True)
    except ConfigError as exc:
        return report_error(exc)
    return 0


def warmed_up_preset(
    preset: str,
    fp8: bool,
    compile_mode: str,
    warmup: int,
    compile_wrapper: str = "auto",
    settings: dict[str, dict[str, Any]] | None = None,
) -> tuple[Built, Trainer]:
    """A preset built for CUDA (FP8 by the default path, or BF16) and trained `warmup` steps on random tokens
    (compile included), its Trainer ready for measured steps. For probes of the step itself (host time, memory),
    which do not depend on the text. `settings`: more config settings by section, e.g. {"train": {"ddp_bucket_mb":
    100}, "fp8": {"fp8_scaling": "delayed"}}."""
    settings = settings or {}
    train = {"max_steps": warmup, "log_every": warmup, "compile_mode": compile_mode, "compile_wrapper": compile_wrapper,
             **settings.get("train", {})}  # fmt: skip
    sections = {**settings, "train": train, "fp8": {"use_fp8": fp8, **settings.get("fp8", {})}}
    config = build_config({"preset": preset, **sections}, device_type="cuda")
    built = build(config)
    tokens = np.random.default_rng(0).integers(0, config.model.vocab_size, 4_000_000, dtype=np.int64)
    trainer, _ = train_for_measurement(built, tokens, tokens, log=lambda message: None)
    return built, trainer
