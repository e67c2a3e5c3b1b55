"""The sweep's outputs: each record paired with its group's BF16 + compile baseline (and a run on several GPUs with
the same configuration on one), and sweep.csv / sweep.md / sweep.png rebuilt from sweep.json (the one file a killed
sweep leaves complete)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cs336_basics.diagnostics.amdahl import format_table as amdahl_table
from cs336_basics.files.atomic import write_text_atomic
from cs336_basics.measure.results import STEP_SERIES, format_or_na
from cs336_basics.sweep.plan import BASELINE_COMPILE, BASELINE_PRECISION, LM_HEAD_SUFFIX, on_off
from cs336_basics.training.metrics import BF16_PEAK_FLOPS
from cs336_basics.training.trainer import WARMUP_STEPS_EXCLUDED

# A record's group: these fields and where it ran (world size, parallel mode; see group_key), everything but the
# precision/compile variant. Its baseline is BF16 + compile(default) in the group. batch_size is per GPU.
# fmt: off
SHAPE_FIELDS = (
    "preset", "dim", "n_layers", "n_heads", "n_kv_heads", "d_ff", "vocab_size", "seq_len", "batch_size",
    "gradient_accumulation_steps", "attention", "gradient_checkpointing",
)
# fmt: on
VARIANT_FIELDS = ("precision", "fp8_lm_head", "fp8_shape_filter", "compile")

# fmt: off
CSV_COLUMNS = (
    "label", "preset", "dim", "n_layers", "n_heads", "n_kv_heads", "d_ff", "vocab_size", "batch_size",
    "gradient_accumulation_steps", "seq_len", "world_size", "parallel", "precision", "fp8_lm_head", "fp8_shape_filter",
    "compile", "attention", "gradient_checkpointing", "status", "step_time_ms", "tokens_per_sec", "mfu",
    "peak_mem_gib", "compile_s", "loss", "speedup_vs_bf16", "scaling_vs_1gpu", "steps", "total_params",
    "non_embedding_params", "train_s", "wall_s", "error", "reason", "log", "command",
)
# fmt: on

_PEAKS = ", ".join(f"{gpu} {flops / 1e12:g}" for gpu, flops in BF16_PEAK_FLOPS.items())
MFU_NOTE = (
    f"MFU is against the GPU's dense BF16 tensor-core peak (TFLOP/s: {_PEAKS}) for every precision, FP8 included, "
    "so it compares across rows; n/a where the peak is unknown (CPU)."
)


def _values(record: dict[str, Any], fields: Sequence[str]) -> tuple:
    return tuple(record.get(name) for name in fields)


def group_key(record: dict[str, Any]) -> tuple:
    """The record's group: its shape, where it ran, and its --vary settings (each value its own BF16 baseline)."""
    return _values(record, SHAPE_FIELDS) + (
        world_size_of(record),
        record.get("parallel") or "none",
        record.get("varied"),
    )


def config_key(record: dict[str, Any]) -> tuple:
    return group_key(record) + _values(record, VARIANT_FIELDS)


def setting_key(record: dict[str, Any]) -> tuple:
    """The configuration apart from where it ran (world size, parallel mode)."""
    return _values(record, (*SHAPE_FIELDS, *VARIANT_FIELDS, "varied"))


def world_size_of(record: dict[str, Any]) -> int:
    return record.get("world_size") or 1  # 1 in files written before the field existed (their parallel: none)


def is_baseline(record: dict[str, Any]) -> bool:
    return record.get("precision") == BASELINE_PRECISION and record.get("compile") == BASELINE_COMPILE


def _measured(record: dict[str, Any]) -> bool:
    return record.get("status") == "ok" and bool(record.get("tokens_per_sec"))


def _ratio_to_reference(record, records, is_reference, key) -> float | None:
    """tokens/s of `record` over that of the last record among `records` that `is_reference` and has its `key`; None
    if either did not run OK or there is no such record."""
    if not _measured(record):
        return None
    references = [r for r in records if is_reference(r) and _measured(r) and key(r) == key(record)]
    return record["tokens_per_sec"] / references[-1]["tokens_per_sec"] if references else None


def speedup_for(record: dict[str, Any], records: Sequence[dict[str, Any]]) -> float | None:
    """tokens/s of `record` over that of the BF16 + compile(default) run of its group (same preset, shape,
    batch, attention, AC, world size, parallel mode and --vary settings) among `records` (the last one if several);
    None if either did not run OK or the group has no baseline. The baseline itself gets 1.0."""
    if is_baseline(record) and _measured(record):
        return 1.0
    return _ratio_to_reference(record, records, is_baseline, group_key)


def scaling_for(record: dict[str, Any], records: Sequence[dict[str, Any]]) -> float | None:
    """For a run on several GPUs: its tokens/s (all GPUs together) over that of the same configuration (same
    per-GPU batch) in one process among `records`; None for one process, or without that run."""
    if world_size_of(record) == 1:
        return None
    return _ratio_to_reference(record, records, lambda r: world_size_of(r) == 1, setting_key)


def pair_speedups(records: Sequence[dict[str, Any]]) -> list[float | None]:
    return [speedup_for(record, records) for record in records]


def pair_scalings(records: Sequence[dict[str, Any]]) -> list[float | None]:
    return [scaling_for(record, records) for record in records]


def latest_runs(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per configuration: a configuration run again (a later sweep into the same folder) replaces
    its earlier record, in the earlier one's place."""
    latest: dict[tuple, dict[str, Any]] = {}
    for record in records:
        latest[config_key(record)] = record
    order = list(dict.fromkeys(config_key(r) for r in records))
    return [latest[key] for key in order]


def combine_repeats(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One configuration's record from its runs in fresh processes (--repeats): the median run by tokens/s (for an
    even count the lower of the middle two, so every field is one real run's), with the spread beside it:
    tokens_per_sec_min / _max, each run's tokens/s and compile time in run order, and each run's per-step series
    (step_series_runs: STEP_SERIES of each run, in run order: how the runs differ step by step, one slower throughout
    or in stretches, and on which rank's host, is what a spread asks). Failed runs are counted and their errors kept;
    the row is "ok" if any run was."""
    if len(runs) == 1:
        return {**runs[0], "repeats": 1}
    ok = sorted((r for r in runs if r.get("status") == "ok"), key=lambda r: r["tokens_per_sec"])
    record = dict(ok[(len(ok) - 1) // 2] if ok else runs[-1])
    record.update(
        repeats=len(runs),
        repeats_ok=len(ok),
        tokens_per_sec_runs=[r.get("tokens_per_sec") for r in runs],
        compile_s_runs=[r.get("compile_s") for r in runs],
        step_series_runs=[{name: r.get(name) for name in STEP_SERIES} for r in runs],
        tokens_per_sec_min=ok[0]["tokens_per_sec"] if ok else None,
        tokens_per_sec_max=ok[-1]["tokens_per_sec"] if ok else None,
        logs=[r.get("log") for r in runs],
    )
    failed = [r.get("error") for r in runs if r.get("status") != "ok"]
    if ok and failed:
        record["repeat_errors"] = failed
    return record


def _tokens_cell(record: dict[str, Any]) -> str:
    """tokens/s; for repeated runs the median run's, with the range of all runs that finished (and, for a sweep stopped
    before the configuration's last run, how many were planned)."""
    cell = format_or_na(record.get("tokens_per_sec"), ",.0f")
    notes = []
    if record.get("repeats", 1) > 1 and record.get("tokens_per_sec_min") is not None:
        low, high = record["tokens_per_sec_min"], record["tokens_per_sec_max"]
        notes.append(f"{low:,.0f}–{high:,.0f}, {record['repeats_ok']} of {record['repeats']}")
    if record.get("repeats_planned"):  # the sweep was stopped before this configuration's last run
        notes.append(f"cut short, {record['repeats_planned']} planned")
    return cell + (f" ({'; '.join(notes)})" if notes else "")


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


def placement_label(record: dict[str, Any]) -> str:
    world = world_size_of(record)
    return "1" if world == 1 else f"{world} {record.get('parallel')}"


def format_table(
    records: Sequence[dict[str, Any]], speedups: Sequence[float | None], scalings: Sequence[float | None]
) -> str:
    # The GPU columns only where some run used several, the setting column only with --vary: a one-GPU sweep's table
    # stays as it was.
    several = any(world_size_of(r) > 1 for r in records)
    varied = any(r.get("varied") for r in records)
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
    if varied:
        header[3:3] = ["setting"]
    if several:
        header[3:3] = ["GPUs"]
        header.append("vs 1 GPU")
    rows = []
    for i, (r, speedup, scaling) in enumerate(zip(records, speedups, scalings, strict=True), 1):
        fp8 = str(r.get("precision", "")).startswith("fp8-")
        row = [
            str(i),
            str(r.get("preset")),
            str(r.get("batch_size")),
            str(r.get("precision")),
            on_off(bool(r.get("fp8_lm_head"))) if fp8 else "-",
            compile_label(r) + (", cold" if r.get("cold") else ""),
            str(r.get("attention")),
            on_off(bool(r.get("gradient_checkpointing"))),
            _status_cell(r),
            format_or_na(r.get("step_time_ms"), ".1f"),
            _tokens_cell(r),
            _pct(r.get("mfu")),
            format_or_na(r.get("peak_mem_gib"), ".2f"),
            format_or_na(r.get("compile_s"), ".1f"),
            format_or_na(r.get("loss"), ".4f"),
            format_or_na(speedup, ".3f", "x"),
        ]
        if varied:
            row[3:3] = [str(r.get("varied") or "-")]
        if several:
            row[3:3] = [placement_label(r)]
            row.append(format_or_na(scaling, ".3f", "x"))
        rows.append(row)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def format_report(
    data: dict[str, Any],
    records: Sequence[dict[str, Any]],
    speedups: Sequence[float | None],
    scalings: Sequence[float | None],
) -> str:
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
        "attention, AC, GPUs and --vary settings in this file; n/a without that baseline.",
        "- loss: mean training loss over the last log interval; peak mem: torch.cuda.max_memory_allocated.",
    ]
    if any(r.get("repeats", 1) > 1 for r in records):
        lines += [
            "- repeated configurations (--repeats): each run a fresh process, the configurations taking turns (one "
            "run each per round); the row is the median run by tokens/s "
            "(the lower middle one for an even count), its range over the runs that finished in brackets; vs "
            "BF16+compile compares the two median runs.",
        ]
    if any(r.get("cold") for r in records):
        lines += ["- cold: every run started with empty compile caches (--cold), as a machine's first run does."]
    if any(world_size_of(r) > 1 for r in records):
        lines += [
            "- GPUs: processes (one per GPU, launched by torchrun) and the parallel mode; batch is per GPU. tokens/s "
            "counts all GPUs together (global batch / step time), MFU is against the peak times the GPUs, and peak "
            "mem is per GPU, the largest over the ranks. vs 1 GPU: tokens/s over the same configuration (same "
            "per-GPU batch) on one GPU in this file.",
        ]
    lines += [
        "",
        format_table(records, speedups, scalings),
    ]
    failures = [(i, r) for i, r in enumerate(records, 1) if r.get("status") != "ok"]
    if failures:
        lines += ["", "Not run / failed:", ""]
        lines += [
            f"{i}. `{r.get('label')}` {r.get('status')}: {r.get('error') or r.get('reason')}" for i, r in failures
        ]
    return "\n".join(lines) + "\n"


def write_csv(
    path: Path, records: Sequence[dict[str, Any]], speedups: Sequence[float | None], scalings: Sequence[float | None]
) -> Path:
    rows = [
        {**r, "speedup_vs_bf16": s, "scaling_vs_1gpu": g} for r, s, g in zip(records, speedups, scalings, strict=True)
    ]
    extra = sorted({key for row in rows for key in row} - set(CSV_COLUMNS))
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=[*CSV_COLUMNS, *extra])
    writer.writeheader()
    writer.writerows(rows)
    return write_text_atomic(path, text.getvalue())


def _variant_label(record: dict[str, Any], show_compile: bool) -> str:
    label = str(record.get("precision")) + (LM_HEAD_SUFFIX if record.get("fp8_lm_head") else "")
    return label + (f" ({compile_label(record)})" if show_compile else "")


def _group_label(record: dict[str, Any], show_attention: bool, show_ac: bool, show_gpus: bool) -> str:
    label = f"{record.get('preset')}\nbs{record.get('batch_size')}"
    if record.get("varied"):
        label += f"\n{record['varied']}"
    if show_gpus:
        label += f" GPUs {placement_label(record)}"
    if show_attention:
        label += f" {record.get('attention')}"
    if show_ac:
        label += f" AC {on_off(bool(record.get('gradient_checkpointing')))}"
    return label


def _plot_labels(
    ok: Sequence[tuple[dict[str, Any], float | None]],
) -> tuple[Callable[[dict[str, Any]], str], Callable[[dict[str, Any]], str]]:
    """(group label, variant label) functions of a record for the plot: they name the compile mode, attention, AC and
    GPUs only where the plotted runs differ in them."""
    vary = lambda key: len({r.get(key) for r, _ in ok}) > 1  # noqa: E731
    show_compile, show_attention, show_ac = vary("compile"), vary("attention"), vary("gradient_checkpointing")
    show_gpus = vary("world_size") or vary("parallel")
    group_of = lambda r: _group_label(r, show_attention, show_ac, show_gpus)  # noqa: E731
    variant_of = lambda r: _variant_label(r, show_compile)  # noqa: E731
    return group_of, variant_of


def _scale_panel(ax: Any, values: list[float], ylabel: str, *, speedups: bool, any_ok: bool) -> str:
    """The y axis of one panel for the bar heights `values`; returns its label. Without bars, a line saying why;
    speedups differ by a few percent, so their axis is zoomed in around 1.0 (the bars are labelled with their
    values); other values get an axis from 0."""
    if not values:
        reason = "no successful runs" if not any_ok else "n/a (no baseline in the sweep, or no known peak here)"
        ax.text(0.5, 0.5, reason, ha="center", va="center", transform=ax.transAxes)
    elif speedups:
        ax.axhline(1.0, color="gray", linewidth=0.8, linestyle="--")
        low, high = min([*values, 1.0]), max([*values, 1.0])
        pad = max(0.05, 0.15 * (high - low))
        ax.set_ylim(max(0.0, low - pad), high + pad)
        ylabel += "\n(axis zoomed around 1.0)"
    else:
        ax.set_ylim(0, max(values) * 1.15)
    return ylabel


def write_plot(path: Path, records: Sequence[dict[str, Any]], speedups: Sequence[float | None], title: str) -> Path:
    """Two bar panels, grouped by preset/batch (and attention/AC where those vary): speedup over the BF16 +
    compile(default) baseline, and MFU. One bar (one colour) per precision, and compile mode where that varies."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [(r, s) for r, s in zip(records, speedups, strict=True) if r.get("status") == "ok"]
    group_of, variant_of = _plot_labels(ok)
    groups = list(dict.fromkeys(group_of(r) for r, _ in ok))
    variants = list(dict.fromkeys(variant_of(r) for r, _ in ok))
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
                (groups.index(group_of(r)) + offset, value_of(r, s))
                for r, s in ok
                if variant_of(r) == variant and value_of(r, s) is not None
            ]
            if points:
                xs, ys = zip(*points, strict=True)
                bars = ax.bar(xs, ys, width=width, color=colors[j % len(colors)], label=variant)
                ax.bar_label(bars, labels=[fmt.format(y) for y in ys], fontsize=7, padding=1)
                handles.setdefault(variant, bars)
                values += ys
        ylabel = _scale_panel(ax, values, ylabel, speedups=ax is axes[0], any_ok=bool(ok))
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
    speedups, scalings = pair_speedups(records), pair_scalings(records)
    report = format_report(data, records, speedups, scalings)
    write_csv(out_dir / "sweep.csv", records, speedups, scalings)
    write_text_atomic(out_dir / "sweep.md", report)
    if plot:
        write_plot(out_dir / "sweep.png", records, speedups, title=f"sweep on {data.get('gpu') or 'CPU'}")
    return report, records


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
