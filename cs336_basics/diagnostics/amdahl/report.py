"""The Amdahl analysis as a record and as tables: AmdahlRow (what analyse returns and the JSON holds), the
summary table and the per-GEMM table."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from cs336_basics.measure.results import format_or_na


@dataclass
class AmdahlRow:
    """Predicted vs measured FP8 speedup for one preset and batch size. Times are ms per optimizer step.

    linear_share is Amdahl's X: the share of the BF16 step in the GEMMs of the linears FP8 converts (the lm_head
    counts only when converted; all_linear_share is every nn.Linear GEMM, lm_head included). matmul_speedup is s.
    """

    preset: str
    batch_size: int
    linear_share: float
    matmul_speedup: float
    predicted_speedup: float
    measured_speedup: float
    predicted_fp8_step_ms: float
    measured_fp8_step_ms: float
    cast_overhead_ms: float
    n_converted: int
    n_linear: int = 0
    recipe: str = "tensorwise"
    seq_len: int = 0
    bf16_step_ms: float = math.nan
    all_linear_share: float = math.nan
    # s seen in the training step itself: BF16 converted-GEMM kernel time / FP8 _scaled_mm kernel time.
    in_situ_matmul_speedup: float = math.nan
    # FP8's extra non-GEMM kernel time per step over BF16's (casts, amax, scales), straight from the profiles.
    profiled_fp8_extra_ms: float = math.nan
    method: str = ""
    attribution: str = ""
    compile: str | bool = "default"
    gpu: str | None = None
    notes: list[str] = field(default_factory=list)
    shapes: list[dict[str, Any]] = field(default_factory=list)
    bf16_breakdown: dict[str, Any] = field(default_factory=dict)
    fp8_breakdown: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: nan and inf become None (JSON has neither)."""
        return _json_safe(dataclasses.asdict(self))


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def format_table(rows: Iterable[AmdahlRow | dict[str, Any]]) -> str:
    """A markdown table: X, s, predicted vs measured speedup and FP8 step time, and the cast overhead.
    Rows may be AmdahlRow objects or their to_dict() form (as read back from JSON)."""
    header = (
        "| preset | batch | FP8 linears | X (converted GEMM share of BF16 step) | s (FP8 GEMM speedup) "
        "| predicted speedup | measured speedup | BF16 step (ms) | FP8 step predicted (ms) | FP8 step measured (ms) "
        "| cast overhead (ms/step) |"
    )
    lines = [header, "|" + "---|" * header.count(" | ") + "---|"]
    for row in rows:
        r = row.to_dict() if isinstance(row, AmdahlRow) else row
        share = r["linear_share"]
        cells = [
            r["preset"],
            str(r["batch_size"]),
            f"{r['n_converted']}/{r['n_linear']}" if r["n_linear"] else str(r["n_converted"]),
            format_or_na(None if share is None else 100 * share, ".1f", "%"),
            format_or_na(r["matmul_speedup"], ".2f", "x"),
            format_or_na(r["predicted_speedup"], ".3f", "x"),
            format_or_na(r["measured_speedup"], ".3f", "x"),
            format_or_na(r["bf16_step_ms"], ".2f"),
            format_or_na(r["predicted_fp8_step_ms"], ".2f"),
            format_or_na(r["measured_fp8_step_ms"], ".2f"),
            format_or_na(r["cast_overhead_ms"], "+.2f"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_shape_table(shape_rows: Iterable[dict[str, Any]]) -> str:
    """Per-GEMM microbenchmark table (MatmulTimings.rows() or AmdahlRow.shapes)."""
    lines = [
        "| GEMM | M x K @ K x N | per step | FP8 | BF16 ms | FP8 ms | speedup | layers |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in shape_rows:
        lines.append(
            f"| {s['kind']} | {s['m']}x{s['k']} @ {s['k']}x{s['n']} | {s['count']} | "
            f"{'yes' if s['converted'] else 'no'} | {format_or_na(s['bf16_ms'], '.3f')} | "
            f"{format_or_na(s['fp8_ms'], '.3f')} | {format_or_na(s['speedup'], '.2f', 'x')} | {s['layers']} |"
        )
    return "\n".join(lines)


def format_top_kernels(label: str, top_kernels: Iterable[tuple[str, float, float]]) -> str:
    """A StepBreakdown's top_kernels as a table: which kernels took the step's GPU time."""
    lines = [f"| {label}: kernel | ms per step | launches per step |", "|---|---|---|"]
    lines += [f"| `{name}` | {ms:.3f} | {launches:g} |" for name, ms, launches in top_kernels]
    return "\n".join(lines)
