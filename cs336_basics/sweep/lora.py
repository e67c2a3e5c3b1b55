"""The sweep's LoRA mode (`--lora_ranks`, `--lora_targets`): for each preset, batch size, rank and targets, a BF16
base and an FP8 base fine-tuned with those adapters, measured, profiled and predicted by
cs336_basics.sweep.lora_analysis in a fresh process; their records gathered in lora.json, the table in lora.md and
the plot in lora.png.

The base is --init_from when given (every preset then has its shape), else a freshly initialised model of each preset
(speed does not depend on what the weights have learned)."""

from __future__ import annotations

import copy
import itertools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cs336_basics.config_layers import merge_layers
from cs336_basics.measure.results import format_or_na
from cs336_basics.sweep.lora_analysis import format_lora_table, write_lora_plot
from cs336_basics.sweep.plan import SweepOptions, log_every_for, preset_batch_size
from cs336_basics.sweep.worker import last_line

LORA_JSON, LORA_MD, LORA_PNG = "lora.json", "lora.md", "lora.png"


def lora_points(options: SweepOptions) -> list[tuple[str, int, int, str]]:
    """(preset, batch size, rank, targets) of every LoRA configuration, in order."""
    grid = options.grid
    return [
        (preset, batch, rank, targets)
        for preset in grid.presets
        for batch in grid.batch_sizes or (preset_batch_size(preset),)
        for rank, targets in itertools.product(options.lora_ranks, options.lora_targets)
    ]


def lora_command(options: SweepOptions, point: tuple[str, int, int, str], config_path: Path, json_path: Path):
    """The analysis process of one point: the sweep's settings in a config file, the LoRA flags on the command line."""
    preset, batch, rank, targets = point
    grid = options.grid
    values = copy.deepcopy(options.base_overrides)
    values["preset"] = preset
    values.setdefault("model", {}).update(attention=grid.attention[0], gradient_checkpointing=grid.ac[0])
    values.setdefault("train", {}).update(
        batch_size=batch, compile_model=grid.compile[0] != "eager", log_every=log_every_for(options.steps),
        **({"compile_mode": grid.compile[0]} if grid.compile[0] != "eager" else {}),
    )  # fmt: skip
    values.setdefault("fp8", {})["fp8_lm_head"] = grid.fp8_lm_head[0]
    settings = merge_layers(options.from_file, values)
    config_path.parent.mkdir(parents=True, exist_ok=True)
    config_path.write_text(json.dumps(settings, indent=2))
    random_base = "init_from" not in settings.get("finetune", {})
    command = [sys.executable, "-m", "cs336_basics.sweep.lora_analysis", "--config", str(config_path)]
    command += ["--lora_rank", str(rank), "--lora_targets", targets, "--steps", str(options.steps)]
    return command + ["--json", str(json_path)] + (["--random_base"] if random_base else [])


def run_lora_sweep(
    options: SweepOptions, out_dir: Path, run_logged: Callable[..., tuple[int, bool]], log=print
) -> list[dict[str, Any]]:
    """Run every LoRA point; returns the records of lora.json (this run's and any earlier ones)."""
    json_path = out_dir / LORA_JSON
    points = lora_points(options)
    for i, point in enumerate(points, 1):
        name = "lora-{}-bs{}-r{}-{}".format(*point).replace(",", "+")
        log(f"[{i}/{len(points)}] {name}: BF16 base, then FP8 base ...")
        log_path = out_dir / "logs" / f"{name}.log"
        command = lora_command(options, point, out_dir / "logs" / f"{name}.config.json", json_path)
        returncode, timed_out = run_logged(command, log_path, options.timeout_s)
        if returncode or timed_out:
            why = f"timeout after {options.timeout_s:g} s" if timed_out else last_line(log_path.read_text())
            log(f"[{i}/{len(points)}] {name}: failed ({why}); its log: {log_path}")
            continue
        fp8 = json.loads(json_path.read_text())["runs"][-1]
        simple, base, ours = (
            format_or_na(fp8.get(f"predicted_speedup_{kind}"), spec, "x")
            for kind, spec in (("simple", ".2f"), ("base_gemms", ".2f"), ("ours", ".3f"))
        )  # n/a under CUDA graphs, where the profiler cannot split the step
        log(
            f"[{i}/{len(points)}] {name}: FP8 base {fp8['speedup_vs_bf16']:.3f}x over BF16 base "
            f"({fp8['tokens_per_sec']:,.0f} tokens/s); predicted: simple {simple}, base GEMMs {base}, ours {ours}"
        )
    records = json.loads(json_path.read_text())["runs"] if json_path.exists() else []
    (out_dir / LORA_MD).write_text(format_lora_table(records) + "\n")
    if records:
        write_lora_plot(out_dir / LORA_PNG, records)
    return records
