"""Throughput sweep: precision x compile mode x attention x activation checkpointing x batch size x preset.

Every configuration runs in a fresh process (`python -m cs336_basics.benchmark.worker`), so one configuration's
compiled graphs, allocator state, OOM or crash cannot touch the next. Each result is appended to
OUT_DIR/sweep.json (results.append_runs: atomic) as soon as it exists, so a killed sweep keeps what it measured;
sweep.csv and sweep.md are rewritten after every configuration, sweep.png at the end.

Configurations are ordered so that each group's baseline (BF16 + torch.compile default mode, same preset, batch,
attention and AC) runs first: every record gets its speedup over that baseline when it is appended.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import csv
import datetime
import itertools
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cs336_basics.benchmark.amdahl import format_table as amdahl_table
from cs336_basics.benchmark.worker import classify_failure, last_line
from cs336_basics.config import (
    ATTENTION_BACKENDS,
    PRESETS,
    RunConfig,
    TrainConfig,
    add_config_arguments,
    build_config,
    load_config_file,
    merge_layers,
    overrides_from_args,
)
from cs336_basics.data import prepare_data
from cs336_basics.errors import ConfigError, report_error
from cs336_basics.results import append_runs, environment, format_or_na, run_record
from cs336_basics.training.trainer import WARMUP_STEPS_EXCLUDED

# Labels as results.precision_label writes them. fp32 is not in the default grid (a CPU reference only).
PRECISIONS = ("bf16", "fp8-tensorwise", "fp8-rowwise", "fp8-rowwise_with_gw_hp", "fp32")
COMPILE_CHOICES = ("eager", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
ON_OFF = {"off": False, "on": True}
DEFAULT_PRESETS = ("366m", "gpt2-small", "1.3b")
DEFAULTS: dict[str, Any] = dict(
    presets=DEFAULT_PRESETS,
    precisions=PRECISIONS[:4],
    fp8_lm_head=(False,),  # the package default; --fp8_lm_head off,on sweeps it
    compile=("eager", "default", "max-autotune"),
    attention=("sdpa", "flash"),
    ac=(False, True),
    batch_sizes=None,  # each preset's own batch size
    steps=30,
    timeout_s=600.0,
)
# --quick: the question most people have (does FP8 pay on this GPU, at the shape we measured?), in ~2-5 minutes
# on one H100/H200: 2 configs x (process start + compile, 30-120 s cold + 20 steps); each is capped at 200 s,
# so the whole sweep stays under 8 minutes even if a compile hangs.
QUICK: dict[str, Any] = dict(
    presets=("366m",),
    precisions=("bf16", "fp8-tensorwise"),
    fp8_lm_head=(False,),
    compile=("default",),
    attention=("sdpa",),
    ac=(False,),
    batch_sizes=(8,),
    steps=20,
    timeout_s=200.0,
)

# Settings the sweep itself sets for every configuration: as pass-through flags they would be silently
# overridden, so they are refused with the sweep flag to use instead.
SWEPT_SETTINGS = {
    ("model", "attention"): "--attention",
    ("model", "gradient_checkpointing"): "--ac off,on",
    ("train", "batch_size"): "--batch_sizes",
    ("train", "max_steps"): "--steps",
    ("train", "compile_model"): "--compile eager,default,...",
    ("train", "compile_mode"): "--compile",
    ("train", "dtype"): "--precisions (bf16 and fp8-* train BF16 weights, fp32 float32)",
    ("train", "out_dir"): "--out_dir (the runs themselves use temporary folders)",
    ("train", "resume"): "nothing (every configuration starts fresh)",
    ("train", "log_every"): "nothing (set from --steps)",
    ("train", "eval_every"): "nothing (benchmarks do not evaluate)",
    ("train", "checkpoint_every"): "nothing (benchmarks write no checkpoints)",
    ("fp8", "use_fp8"): "--precisions",
    ("fp8", "fp8_recipe"): "--precisions fp8-tensorwise,fp8-rowwise,...",
    ("fp8", "fp8_lm_head"): "--fp8_lm_head off,on",
}

# A record's group: everything but the precision/compile variant. Its baseline is BF16 + compile(default).
# fmt: off
GROUP_FIELDS = (
    "preset", "dim", "n_layers", "n_heads", "n_kv_heads", "d_ff", "vocab_size", "seq_len", "batch_size",
    "gradient_accumulation_steps", "attention", "gradient_checkpointing",
)
# fmt: on
VARIANT_FIELDS = ("precision", "fp8_lm_head", "fp8_shape_filter", "compile")
BASELINE_PRECISION, BASELINE_COMPILE = "bf16", "default"

# fmt: off
CSV_COLUMNS = (
    "label", "preset", "dim", "n_layers", "n_heads", "n_kv_heads", "d_ff", "vocab_size", "batch_size",
    "gradient_accumulation_steps", "seq_len", "precision", "fp8_lm_head", "fp8_shape_filter", "compile",
    "attention", "gradient_checkpointing", "status", "step_time_ms", "tokens_per_sec", "mfu", "peak_mem_gib",
    "compile_s", "loss", "speedup_vs_bf16", "steps", "total_params", "non_embedding_params", "train_s", "wall_s",
    "error", "reason", "log", "command",
)
# fmt: on

MFU_NOTE = (
    "MFU is against the dense BF16 tensor-core peak (989 TFLOP/s on H100/H200) for every precision, FP8 included, "
    "so it compares across rows; n/a where the peak is unknown (CPU)."
)


# ---- the grid ----


@dataclass(frozen=True)
class SweepPoint:
    """One configuration of the grid."""

    preset: str
    batch_size: int
    precision: str
    fp8_lm_head: bool
    compile: str  # "eager" or a torch.compile mode
    attention: str
    ac: bool

    @property
    def is_fp8(self) -> bool:
        return self.precision.startswith("fp8-")

    @property
    def is_baseline(self) -> bool:
        return self.precision == BASELINE_PRECISION and self.compile == BASELINE_COMPILE

    @property
    def label(self) -> str:
        precision = self.precision + ("+lm_head" if self.fp8_lm_head else "")
        return f"{self.preset}/bs{self.batch_size}/{precision}/{self.compile}/{self.attention}/ac-{_on_off(self.ac)}"

    def overrides(self, base: dict[str, Any], steps: int) -> dict[str, Any]:
        """config.build_config overrides for this point: the pass-through settings plus the swept ones."""
        values = copy.deepcopy(base)
        values["preset"] = self.preset
        values.setdefault("model", {}).update(attention=self.attention, gradient_checkpointing=self.ac)
        values.setdefault("train", {}).update(
            batch_size=self.batch_size,
            max_steps=steps,
            log_every=log_every_for(steps),
            eval_every=0,
            checkpoint_every=0,
            resume=False,
            compile_model=self.compile != "eager",
            compile_mode=BASELINE_COMPILE if self.compile == "eager" else self.compile,
            dtype="float32" if self.precision == "fp32" else "bfloat16",
        )
        fp8 = values.setdefault("fp8", {})
        fp8.update(use_fp8=self.is_fp8, fp8_lm_head=self.fp8_lm_head)
        if self.is_fp8:
            fp8["fp8_recipe"] = self.precision.removeprefix("fp8-")
        return values


@dataclass(frozen=True)
class Grid:
    presets: tuple[str, ...]
    precisions: tuple[str, ...]
    fp8_lm_head: tuple[bool, ...]
    compile: tuple[str, ...]
    attention: tuple[str, ...]
    ac: tuple[bool, ...]
    batch_sizes: tuple[int, ...] | None  # None: each preset's own batch size


def _on_off(flag: bool) -> str:
    return "on" if flag else "off"


def log_every_for(steps: int) -> int:
    """Log (the Trainer's only sync point) every 5-10 steps, on a divisor of `steps` so the last step is a log
    point: its timings are collected and `loss` is the mean over the last interval, not the whole run."""
    return next((d for d in range(10, 4, -1) if steps % d == 0), steps)


def preset_batch_size(preset: str) -> int:
    return PRESETS[preset].get("train", {}).get("batch_size", TrainConfig.batch_size)


def expand_grid(grid: Grid) -> list[SweepPoint]:
    """Every combination, grouped by (preset, batch, attention, AC) with the group's BF16 + compile(default)
    baseline first. fp8_lm_head only multiplies the FP8 precisions (it means nothing without FP8)."""
    points = []
    for preset in grid.presets:
        for batch in grid.batch_sizes or (preset_batch_size(preset),):
            for attention, ac in itertools.product(grid.attention, grid.ac):
                group = [
                    SweepPoint(preset, batch, precision, lm_head, mode, attention, ac)
                    for mode in grid.compile
                    for precision in grid.precisions
                    for lm_head in (grid.fp8_lm_head if precision.startswith("fp8-") else (False,))
                ]
                points += sorted(group, key=lambda p: not p.is_baseline)  # stable: the baseline moves first
    return points


def parse_choices(text: str, allowed: Sequence[str], flag: str) -> tuple[str, ...]:
    """A comma-separated subset of `allowed`, in the given order, duplicates dropped."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise ConfigError(f"{flag} is empty; give a comma-separated list from: {', '.join(allowed)}.")
    bad = [item for item in items if item not in allowed]
    if bad:
        raise ConfigError(f"{flag}: unknown value(s) {', '.join(map(repr, bad))}; choose from {', '.join(allowed)}.")
    return tuple(dict.fromkeys(items))


def parse_on_off(text: str, flag: str) -> tuple[bool, ...]:
    return tuple(ON_OFF[item] for item in parse_choices(text, tuple(ON_OFF), flag))


def parse_batch_sizes(text: str) -> tuple[int, ...]:
    items = [item.strip() for item in text.split(",") if item.strip()]
    try:
        sizes = [int(item) for item in items]
    except ValueError:
        sizes = []
    if not items or len(sizes) != len(items) or min(sizes) < 1:
        raise ConfigError(f"--batch_sizes must be comma-separated positive integers (e.g. 4,8), got {text!r}.")
    return tuple(dict.fromkeys(sizes))


# ---- the plan: points with their validated configs ----


@dataclass(frozen=True)
class Planned:
    point: SweepPoint
    overrides: dict[str, Any]
    from_file: dict[str, Any]
    config: RunConfig  # built here, so a bad pass-through setting fails before the sweep starts

    @property
    def spec(self) -> dict[str, Any]:
        """What the worker gets: it rebuilds the same config with config.build_config."""
        return {"overrides": self.overrides, "from_file": self.from_file, "extra": {"label": self.point.label}}


@dataclass
class SweepOptions:
    grid: Grid
    steps: int
    timeout_s: float
    out_dir: Path | None  # None: the dated default
    base_overrides: dict[str, Any]
    from_file: dict[str, Any]
    quick: bool
    dry_run: bool
    amdahl: bool = False


def plan_sweep(options: SweepOptions) -> list[Planned]:
    plan = []
    for point in expand_grid(options.grid):
        overrides = point.overrides(options.base_overrides, options.steps)
        plan.append(Planned(point, overrides, options.from_file, build_config(overrides, options.from_file)))
    return plan


def check_pass_through(overrides: dict[str, Any]) -> None:
    if "preset" in overrides:
        raise ConfigError("--preset is set per configuration by the sweep; use --presets (comma-separated).")
    for (section, name), instead in SWEPT_SETTINGS.items():
        if name in overrides.get(section, {}):
            raise ConfigError(f"--{name} is set per configuration by the sweep; use {instead}.")


# ---- pairing with the baseline ----


def group_key(record: dict[str, Any]) -> tuple:
    return tuple(record.get(name) for name in GROUP_FIELDS)


def config_key(record: dict[str, Any]) -> tuple:
    return group_key(record) + tuple(record.get(name) for name in VARIANT_FIELDS)


def is_baseline(record: dict[str, Any]) -> bool:
    return record.get("precision") == BASELINE_PRECISION and record.get("compile") == BASELINE_COMPILE


def speedup_for(record: dict[str, Any], records: Sequence[dict[str, Any]]) -> float | None:
    """tokens/s of `record` over that of the BF16 + compile(default) run of its group (same preset, shape,
    batch, attention and AC) among `records` (the last one if several); None if either did not run OK or the
    group has no baseline. The baseline itself gets 1.0."""
    if record.get("status") != "ok" or not record.get("tokens_per_sec"):
        return None
    if is_baseline(record):
        return 1.0
    key = group_key(record)
    baselines = [r for r in records if is_baseline(r) and r.get("status") == "ok" and group_key(r) == key]
    baselines = [r for r in baselines if r.get("tokens_per_sec")]
    return record["tokens_per_sec"] / baselines[-1]["tokens_per_sec"] if baselines else None


def pair_speedups(records: Sequence[dict[str, Any]]) -> list[float | None]:
    return [speedup_for(record, records) for record in records]


def latest_runs(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per configuration: a configuration run again (a later sweep into the same folder) replaces
    its earlier record, in the earlier one's place."""
    latest: dict[tuple, dict[str, Any]] = {}
    for record in records:
        latest[config_key(record)] = record
    order = list(dict.fromkeys(config_key(r) for r in records))
    return [latest[key] for key in order]


# ---- running one configuration in its own process ----


def worker_command(spec: dict[str, Any], out_path: Path) -> list[str]:
    return [sys.executable, "-m", "cs336_basics.benchmark.worker", "--spec", json.dumps(spec), "--out", str(out_path)]


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # so the package imports from any working directory
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env["TQDM_DISABLE"] = "1"  # no progress bar in the log files
    return env


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the worker and anything it started (torch.compile's compile workers), all in its own session."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _tail(path: Path, n_bytes: int = 20000) -> str:
    try:
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - n_bytes))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def run_logged(command: list[str], log_path: Path, timeout_s: float) -> tuple[int, bool]:
    """Run command in its own session with its output in log_path; (return code, timed out). Never leaves it
    running: on timeout or Ctrl-C the whole process group is killed."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    timed_out = False
    with log_path.open("w") as log:
        log.write("$ " + " ".join(shlex.quote(part) for part in command) + "\n")
        log.flush()
        proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=_worker_env(), start_new_session=True
        )
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:  # also on Ctrl-C: the worker is in its own session, so the terminal's SIGINT never reaches it
            _kill_group(proc)
            proc.wait()
    return proc.returncode, timed_out


def run_isolated(planned: Planned, work_dir: Path, log_path: Path, timeout_s: float) -> dict[str, Any]:
    """Run one configuration in a fresh worker process, its output going to log_path; return its record (never
    raises for a failed run)."""
    out_path = work_dir / f"result-{time.monotonic_ns()}.json"
    started = time.perf_counter()
    returncode, timed_out = run_logged(worker_command(planned.spec, out_path), log_path, timeout_s)
    wall_s = time.perf_counter() - started

    base = run_record(planned.config, status="error", fp8_shape_filter=planned.config.fp8.fp8_shape_filter)
    base.update(step_time_ms=None, label=planned.point.label)
    if out_path.exists():  # the worker finished its record (even if it then hung on exit)
        record = {**base, **json.loads(out_path.read_text())}
        out_path.unlink()
    else:
        status, message = classify_failure(_tail(log_path), returncode, timed_out=timed_out, timeout_s=timeout_s)
        record = {**base, "status": status, "error": message}
    record["wall_s"] = wall_s
    return record


# ---- outputs ----


def _pct(fraction: float | None) -> str:
    return format_or_na(None if fraction is None else 100 * fraction, ".1f", "%")


def _status_cell(record: dict[str, Any], width: int = 70) -> str:
    status = record.get("status", "?")
    detail = record.get("error") or record.get("reason")
    if status == "ok" or not detail:
        return status
    text = f"{status}: {detail}"
    return (text if len(text) <= width else text[: width - 3] + "...").replace("|", "\\|")


def compile_label(record: dict[str, Any]) -> str:
    return "eager" if record.get("compile") is False else str(record.get("compile"))


def format_table(records: Sequence[dict[str, Any]], speedups: Sequence[float | None]) -> str:
    header = [
        "#",
        "preset",
        "batch",
        "precision",
        "fp8 lm_head",
        "compile",
        "attention",
        "AC",
        "status",
        "step (ms)",
        "tokens/s",
        "MFU (vs BF16 peak)",
        "peak mem (GiB)",
        "compile (s)",
        "loss",
        "vs BF16+compile",
    ]
    rows = []
    for i, (r, speedup) in enumerate(zip(records, speedups, strict=True), 1):
        fp8 = str(r.get("precision", "")).startswith("fp8-")
        rows.append(
            [
                str(i),
                str(r.get("preset")),
                str(r.get("batch_size")),
                str(r.get("precision")),
                _on_off(bool(r.get("fp8_lm_head"))) if fp8 else "-",
                compile_label(r),
                str(r.get("attention")),
                _on_off(bool(r.get("gradient_checkpointing"))),
                _status_cell(r),
                format_or_na(r.get("step_time_ms"), ".1f"),
                format_or_na(r.get("tokens_per_sec"), ",.0f"),
                _pct(r.get("mfu")),
                format_or_na(r.get("peak_mem_gib"), ".2f"),
                format_or_na(r.get("compile_s"), ".1f"),
                format_or_na(r.get("loss"), ".4f"),
                format_or_na(speedup, ".3f", "x"),
            ]
        )
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def format_report(data: dict[str, Any], records: Sequence[dict[str, Any]], speedups: Sequence[float | None]) -> str:
    counts = {s: sum(r.get("status") == s for r in records) for s in ("ok", "skipped", "oom", "error")}
    steps = sorted({r.get("steps") for r in records if r.get("steps")})
    lines = [
        f"# Throughput sweep on {data.get('gpu') or 'CPU'}",
        "",
        f"torch {data.get('torch')}, torchao {data.get('torchao')}; {len(records)} configurations: "
        + ", ".join(f"{n} {s}" for s, n in counts.items() if n),
        "",
        f"- {MFU_NOTE}",
        f"- step (ms): median optimizer-step time over steps {WARMUP_STEPS_EXCLUDED + 1}.."
        f"{'/'.join(map(str, steps)) or 'N'} (the first {WARMUP_STEPS_EXCLUDED}, which compile and warm up, "
        "excluded); tokens/s = tokens per step / that median; compile (s): the first step, reported apart.",
        "- vs BF16+compile: tokens/s over the BF16 + torch.compile (default mode) run of the same preset, batch, "
        "attention and AC in this file; n/a without that baseline.",
        "- loss: mean training loss over the last log interval; peak mem: torch.cuda.max_memory_allocated.",
        "",
        format_table(records, speedups),
    ]
    failures = [(i, r) for i, r in enumerate(records, 1) if r.get("status") != "ok"]
    if failures:
        lines += ["", "Not run / failed:", ""]
        lines += [
            f"{i}. `{r.get('label')}` {r.get('status')}: {r.get('error') or r.get('reason')}" for i, r in failures
        ]
    return "\n".join(lines) + "\n"


def write_csv(path: Path, records: Sequence[dict[str, Any]], speedups: Sequence[float | None]) -> Path:
    rows = [{**r, "speedup_vs_bf16": s} for r, s in zip(records, speedups, strict=True)]
    extra = sorted({key for row in rows for key in row} - set(CSV_COLUMNS))
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*CSV_COLUMNS, *extra])
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, path)
    return path


def _variant_label(record: dict[str, Any], show_compile: bool) -> str:
    label = str(record.get("precision")) + ("+lm_head" if record.get("fp8_lm_head") else "")
    return label + (f" ({compile_label(record)})" if show_compile else "")


def _group_label(record: dict[str, Any], show_attention: bool, show_ac: bool) -> str:
    label = f"{record.get('preset')}\nbs{record.get('batch_size')}"
    if show_attention:
        label += f" {record.get('attention')}"
    if show_ac:
        label += f" AC {_on_off(bool(record.get('gradient_checkpointing')))}"
    return label


def write_plot(path: Path, records: Sequence[dict[str, Any]], speedups: Sequence[float | None], title: str) -> Path:
    """Two bar panels, grouped by preset/batch (and attention/AC where those vary): speedup over the BF16 +
    compile(default) baseline, and MFU. One bar (one colour) per precision, and compile mode where that varies."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [(r, s) for r, s in zip(records, speedups, strict=True) if r.get("status") == "ok"]
    vary = lambda key: len({r.get(key) for r, _ in ok}) > 1  # noqa: E731
    show_compile, show_attention, show_ac = vary("compile"), vary("attention"), vary("gradient_checkpointing")
    groups = list(dict.fromkeys(_group_label(r, show_attention, show_ac) for r, _ in ok))
    variants = list(dict.fromkeys(_variant_label(r, show_compile) for r, _ in ok))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    width = 0.8 / max(1, len(variants))
    fig, axes = plt.subplots(2, 1, figsize=(max(7.0, 1.5 + 0.4 * len(groups) * max(1, len(variants))), 8.5))
    panels = (
        (axes[0], "speedup vs BF16 + compile(default)", lambda r, s: s, "{:.2f}x"),
        (
            axes[1],
            "MFU (% of dense BF16 peak)",
            lambda r, s: None if r.get("mfu") is None else 100 * r["mfu"],
            "{:.1f}",
        ),
    )
    handles = {}
    for ax, ylabel, value_of, fmt in panels:
        values = []
        for j, variant in enumerate(variants):
            offset = (j - (len(variants) - 1) / 2) * width
            points = [
                (groups.index(_group_label(r, show_attention, show_ac)) + offset, value_of(r, s))
                for r, s in ok
                if _variant_label(r, show_compile) == variant and value_of(r, s) is not None
            ]
            if points:
                xs, ys = zip(*points, strict=True)
                bars = ax.bar(xs, ys, width=width, color=colors[j % len(colors)], label=variant)
                ax.bar_label(bars, labels=[fmt.format(y) for y in ys], fontsize=7, padding=1)
                handles.setdefault(variant, bars)
                values += ys
        if not values:
            reason = "no successful runs" if not ok else "n/a (no baseline in the sweep, or no known peak here)"
            ax.text(0.5, 0.5, reason, ha="center", va="center", transform=ax.transAxes)
        elif ax is axes[0]:
            # Speedups differ by a few percent: zoom in around 1.0 (the bars are labelled with their values).
            ax.axhline(1.0, color="gray", linewidth=0.8, linestyle="--")
            low, high = min([*values, 1.0]), max([*values, 1.0])
            pad = max(0.05, 0.15 * (high - low))
            ax.set_ylim(max(0.0, low - pad), high + pad)
            ylabel += "\n(axis zoomed around 1.0)"
        else:
            ax.set_ylim(0, max(values) * 1.15)
        ax.set_xticks(range(len(groups)), groups, fontsize=8)
        ax.set_ylabel(ylabel, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_title(title)
    if handles:
        fig.legend(handles.values(), handles.keys(), loc="lower center", ncols=min(4, len(handles)), fontsize=8)
    fig.tight_layout(rect=(0, 0.04 + 0.03 * ((len(handles) - 1) // 4), 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_outputs(out_dir: Path, plot: bool = True) -> tuple[str, list[dict[str, Any]]]:
    """Rebuild sweep.csv / sweep.md (and sweep.png) from sweep.json; returns (markdown, latest records)."""
    data = json.loads((out_dir / "sweep.json").read_text())
    records = latest_runs(data["runs"])
    speedups = pair_speedups(records)
    report = format_report(data, records, speedups)
    write_csv(out_dir / "sweep.csv", records, speedups)
    tmp = out_dir / "sweep.md.tmp"
    tmp.write_text(report)
    os.replace(tmp, out_dir / "sweep.md")
    if plot:
        write_plot(out_dir / "sweep.png", records, speedups, title=f"sweep on {data.get('gpu') or 'CPU'}")
    return report, records


# ---- the command line ----


def gpu_slug(gpu_name: str | None) -> str:
    """For file names: "NVIDIA H100 80GB HBM3" -> "h100"; an unknown GPU -> its name as a slug; none -> "cpu"."""
    if not gpu_name:
        return "cpu"
    known = re.search(r"\b([A-Z]{1,2}\d{2,3}[A-Z]?)\b", gpu_name)
    if known:
        return known.group(1).lower()
    return re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-") or "gpu"


def default_out_dir(gpu_name: str | None, today: datetime.date | None = None) -> Path:
    today = today or datetime.date.today()
    return Path("benchmarks/results") / f"{today.isoformat()}-sweep-{gpu_slug(gpu_name)}"


EPILOG = """\
Every other flag is a train_h100.py setting applied to every configuration, e.g. --dim/--n_layers/--context_length
(a custom shape on top of each preset), --no_fp8_shape_filter, --fp8_format, --device, --seed, --lr,
--dataset, --train_data/--val_data, --config FILE. Flags the sweep sets itself (--batch_size, --attention,
--use_fp8, --compile_mode, ...) are refused with the sweep flag to use instead.

examples:
  optimize_performance.py --quick                       # 366m, bf16 vs fp8-tensorwise, compile default, 20 steps
  optimize_performance.py --presets 366m,1.3b --precisions bf16,fp8-tensorwise --compile default \\
      --attention sdpa --ac off --batch_sizes 4,8
  optimize_performance.py --presets 1.3b --fp8_lm_head off,on --dry_run   # print the plan only
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="optimize_performance.py",
        description="Throughput sweep: each configuration trained for a few steps in its own process; step time, "
        "tokens/s, MFU, peak memory, compile time, loss and the speedup over BF16 + compile(default).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    full = lambda key: ",".join(DEFAULTS[key])  # noqa: E731
    grid = parser.add_argument_group("the grid (comma-separated subsets; defaults: the full grid, lm_head off)")
    grid.add_argument("--presets", help=f"from {', '.join(PRESETS)} (default {full('presets')})")
    grid.add_argument("--precisions", help=f"from {', '.join(PRECISIONS)} (default {full('precisions')})")
    grid.add_argument(
        "--fp8_lm_head",
        help="off,on: also convert the output projection; multiplies only the FP8 precisions (default off, as in "
        "train_h100.py)",
    )
    grid.add_argument("--compile", help=f"from {', '.join(COMPILE_CHOICES)} (default {full('compile')})")
    grid.add_argument("--attention", help=f"from {', '.join(ATTENTION_BACKENDS)} (default {full('attention')})")
    grid.add_argument("--ac", help="activation checkpointing: off,on (default off,on)")
    grid.add_argument("--batch_sizes", help="e.g. 4,8 (default: each preset's own batch size)")
    run = parser.add_argument_group("the run")
    run.add_argument("--steps", type=int, help=f"optimizer steps per configuration (default {DEFAULTS['steps']})")
    run.add_argument(
        "--timeout_s", type=float, help=f"per-configuration limit in seconds (default {DEFAULTS['timeout_s']:g})"
    )
    run.add_argument("--out_dir", help="default benchmarks/results/<date>-sweep-<gpu>")
    run.add_argument(
        "--quick",
        action="store_true",
        help="366m, bf16 vs fp8-tensorwise, compile default, sdpa, AC off, batch 8, 20 steps, 200 s per config, "
        "then the Amdahl analysis (about 4 minutes on one H200); explicit grid flags still override",
    )
    run.add_argument(
        "--amdahl",
        action="store_true",
        help="after the sweep, for each preset/batch with an FP8 + compile configuration: where the time goes "
        "(profiled GEMM share X, FP8 GEMM speedup s, Amdahl prediction vs measured, cast cost in ms); on with --quick",
    )
    run.add_argument("--dry_run", action="store_true", help="print the planned configurations and exit")
    return parser


def parse_options(argv: Sequence[str] | None = None) -> SweepOptions:
    args, rest = build_parser().parse_known_args(argv)
    passthrough = argparse.ArgumentParser(
        prog="optimize_performance.py",
        usage="optimize_performance.py [sweep flags] [train_h100.py settings] (see --help)",
        allow_abbrev=False,
    )
    add_config_arguments(passthrough)
    train_args = passthrough.parse_args(rest)
    base = overrides_from_args(train_args)
    check_pass_through(base)
    from_file = load_config_file(train_args.config) if train_args.config else {}

    defaults = QUICK if args.quick else DEFAULTS
    pick = lambda name, parse: parse(getattr(args, name)) if getattr(args, name) is not None else defaults[name]  # noqa: E731
    grid = Grid(
        presets=pick("presets", lambda s: parse_choices(s, tuple(PRESETS), "--presets")),
        precisions=pick("precisions", lambda s: parse_choices(s, PRECISIONS, "--precisions")),
        fp8_lm_head=pick("fp8_lm_head", lambda s: parse_on_off(s, "--fp8_lm_head")),
        compile=pick("compile", lambda s: parse_choices(s, COMPILE_CHOICES, "--compile")),
        attention=pick("attention", lambda s: parse_choices(s, ATTENTION_BACKENDS, "--attention")),
        ac=pick("ac", lambda s: parse_on_off(s, "--ac")),
        batch_sizes=pick("batch_sizes", parse_batch_sizes),
    )
    steps = args.steps if args.steps is not None else defaults["steps"]
    if steps <= WARMUP_STEPS_EXCLUDED:
        raise ConfigError(
            f"--steps must be more than {WARMUP_STEPS_EXCLUDED}: the first {WARMUP_STEPS_EXCLUDED} steps (compile, "
            "warm-up) are left out of the step-time median."
        )
    timeout_s = args.timeout_s if args.timeout_s is not None else defaults["timeout_s"]
    if timeout_s <= 0:
        raise ConfigError(f"--timeout_s must be positive, got {timeout_s:g}.")
    return SweepOptions(
        grid=grid,
        steps=steps,
        timeout_s=timeout_s,
        out_dir=Path(args.out_dir) if args.out_dir else None,
        base_overrides=base,
        from_file=from_file,
        quick=args.quick,
        dry_run=args.dry_run,
        amdahl=args.amdahl or args.quick,
    )


def format_plan(plan: Sequence[Planned], options: SweepOptions, out_dir: Path) -> str:
    mode = " (--quick)" if options.quick else ""
    lines = [
        f"sweep plan{mode}: {len(plan)} configuration{'s' * (len(plan) != 1)}, {options.steps} steps each, "
        f"each in its own process with a {options.timeout_s:g} s limit"
    ]
    width = len(str(len(plan)))
    for i, planned in enumerate(plan, 1):
        note = "  (baseline)" if planned.point.is_baseline else ""
        lines.append(f"  {i:>{width}}. {planned.point.label}{note}")
    if options.base_overrides:
        lines.append(f"settings for every configuration: {json.dumps(options.base_overrides)}")
    lines.append(f"results: {out_dir}/sweep.{{json,csv,md,png}}")
    return "\n".join(lines)


def prepare_all_data(plan: Sequence[Planned], log: Callable[[str], None]) -> None:
    """Tokenise and cache each distinct (data, vocabulary) once, here, so that the workers only read the cache
    and never race to build it."""
    seen = set()
    for planned in plan:
        key = (planned.config.data, planned.config.model.vocab_size)
        if key not in seen:
            seen.add(key)
            started = time.perf_counter()
            data = prepare_data(*key)
            log(f"data: {data.description} (vocab {key[1]}; ready in {time.perf_counter() - started:.1f} s)")


def _progress_line(i: int, n: int, record: dict[str, Any]) -> str:
    head = f"[{i}/{n}] {record.get('label')}: "
    if record.get("status") != "ok":
        return head + _status_cell(record, width=160) + f" ({record['wall_s']:.0f} s)"
    speedup = record.get("speedup_vs_bf16")
    return head + (
        f"ok {record['step_time_ms']:.1f} ms/step, {format_or_na(record.get('tokens_per_sec'), ',.0f')} tokens/s, "
        f"MFU {_pct(record.get('mfu'))}, peak {format_or_na(record.get('peak_mem_gib'), '.2f')} GiB, "
        f"compile {format_or_na(record.get('compile_s'), '.1f')} s"
        + (f", {speedup:.3f}x vs BF16+compile" if speedup is not None else "")
        + f" ({record['wall_s']:.0f} s)"
    )


def _log_name(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", label) + ".log"


def run_sweep(plan: Sequence[Planned], options: SweepOptions, out_dir: Path, log=print) -> list[dict[str, Any]]:
    """Run every planned configuration in its own process, appending each record to out_dir/sweep.json as it
    arrives. Returns this invocation's records."""
    json_path = out_dir / "sweep.json"
    previous = json.loads(json_path.read_text())["runs"] if json_path.exists() else []
    if previous:
        log(
            f"appending to {json_path} ({len(previous)} runs already there; a configuration run again replaces "
            "its earlier row in the table)"
        )
    records: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="cs336-sweep-") as work:
        for i, planned in enumerate(plan, 1):
            log(f"[{i}/{len(plan)}] {planned.point.label}: running ...")
            log_name = f"logs/{_log_name(planned.point.label)}"
            record = run_isolated(planned, Path(work), out_dir / log_name, options.timeout_s)
            record["log"] = log_name  # relative to the results folder, which may be moved or committed
            record["speedup_vs_bf16"] = speedup_for(record, latest_runs([*previous, *records, record]))
            records.append(record)
            append_runs(json_path, [record])
            write_outputs(out_dir, plot=False)
            log(_progress_line(i, len(plan), record))
    return records


# ---- where the time goes: one Amdahl analysis per preset/batch ----


def amdahl_targets(plan: Sequence[Planned]) -> list[Planned]:
    """The first FP8 + compile configuration of each preset/batch/attention/AC group: its FP8 settings (recipe,
    lm_head, shape filter) decide which GEMMs count as converted in the analysis."""
    chosen: dict[tuple, Planned] = {}
    for planned in plan:
        p = planned.point
        if p.is_fp8 and p.compile != "eager":
            chosen.setdefault((p.preset, p.batch_size, p.attention, p.ac), planned)
    return list(chosen.values())


def run_amdahl(planned: Planned, out_dir: Path, timeout_s: float) -> dict[str, Any]:
    """cs336_basics.benchmark.amdahl in its own process for one configuration; its row, or a status record."""
    p = planned.point
    name = f"amdahl-{p.preset}-bs{p.batch_size}-{p.attention}-ac-{_on_off(p.ac)}"
    config_path = out_dir / "logs" / f"{name}.config.json"
    config_path.parent.mkdir(parents=True, exist_ok=True)
    config_path.write_text(json.dumps(merge_layers(planned.from_file, planned.overrides), indent=2))
    json_path = out_dir / f"{name}.json"
    command = [sys.executable, "-m", "cs336_basics.benchmark.amdahl", "--config", str(config_path)]
    returncode, timed_out = run_logged(
        [*command, "--json", str(json_path)], out_dir / "logs" / f"{name}.log", timeout_s
    )
    if json_path.exists() and not timed_out and returncode == 0:
        return {**json.loads(json_path.read_text())["runs"][0], "status": "ok"}
    tail = last_line(_tail(out_dir / "logs" / f"{name}.log"))
    status = "skipped" if returncode == 2 else "error"  # 2: a ConfigError, e.g. no CUDA GPU here
    return {
        "preset": p.preset,
        "batch_size": p.batch_size,
        "status": status,
        "error": f"timeout after {timeout_s:g} s" if timed_out else tail,
    }


def format_amdahl(rows: Sequence[dict[str, Any]]) -> str:
    done = [r for r in rows if r["status"] == "ok"]
    lines = ["## Where the time goes (Amdahl: speedup = 1 / ((1 - X) + X / s))", ""]
    if done:
        lines += [amdahl_table(done), ""]
        lines.append(
            "X: share of the BF16 step in the GEMMs that FP8 converts (profiled); s: FP8 vs BF16 speed of those GEMMs "
            "at their shapes (microbenchmarked, casts excluded); cast overhead: measured FP8 step minus predicted."
        )
    lines += [f"- {r['preset']} batch {r['batch_size']}: {r['status']}: {r['error']}" for r in rows if r not in done]
    return "\n".join(lines)


def _terminate(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    try:
        options = parse_options(argv)
        plan = plan_sweep(options)
    except ConfigError as exc:
        return report_error(exc)
    gpu = environment()["gpu"]
    out_dir = options.out_dir or default_out_dir(gpu)
    print(format_plan(plan, options, out_dir), flush=True)
    if options.dry_run:
        print("dry run: nothing was run.")
        return 0
    if options.quick and gpu is None:
        print("note: --quick is sized for an H100/H200; without a GPU the FP8 row is skipped and 366m is slow.")
    say = lambda line: print(line, flush=True)  # noqa: E731
    records: list[dict[str, Any]] = []
    # A scheduler's SIGTERM takes the Ctrl-C path: the running worker (in its own session) is killed, not orphaned.
    previous_handler = signal.signal(signal.SIGTERM, _terminate)
    try:
        prepare_all_data(plan, log=say)
        out_dir.mkdir(parents=True, exist_ok=True)
        records = run_sweep(plan, options, out_dir, log=say)
    except ConfigError as exc:  # the data: missing files, ids outside the vocabulary, ...
        return report_error(exc)
    except KeyboardInterrupt:
        if not (out_dir / "sweep.json").exists():
            print("\ninterrupted before any configuration finished; nothing was written.", file=sys.stderr)
            return 130
        write_outputs(out_dir, plot=True)
        print(
            f"\ninterrupted: {out_dir}/sweep.{{json,csv,md,png}} hold the configurations that finished.",
            file=sys.stderr,
        )
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous_handler)
    report, _ = write_outputs(out_dir, plot=True)
    print()
    print(report)
    if options.amdahl:
        rows = []
        for planned in amdahl_targets(plan):
            say(f"where the time goes: {planned.point.preset} batch {planned.point.batch_size} ...")
            rows.append(run_amdahl(planned, out_dir, options.timeout_s))
        if rows:
            analysis = format_amdahl(rows)
            (out_dir / "amdahl.md").write_text(analysis + "\n")
            print()
            print(analysis)
    print(f"wrote {out_dir}/sweep.json, sweep.csv, sweep.md, sweep.png (per-configuration logs in {out_dir}/logs)")
    return 1 if any(r.get("status") == "error" for r in records) else 0
