"""Which rank's host a run's slow steps waited for, from the per-step series a run records.

Every training run's record (`result.json`, or a sweep's `sweep.json` row, whose repeated runs are each in
`step_series_runs`) has `step_ms` and, per rank, `host_ms`, `host_cpu_ms` and `gc_ms` (docs/performance.md). This
reads them and prints, for each run: its median step, the steps slower than `--slow` times it, and per rank the
median host time, CPU time and collector pauses in the slow steps against the rest. Under torchrun every rank waits
for the slowest host: the rank whose host time rose with the slow steps is the one they waited for; whether its CPU
time rose with it says if it worked longer (a slower or shared core, more work) or waited (for a core, the GPU).

    python -m lab.step_series runs/default/result.json
    python -m lab.step_series sweep/sweep.json --slow 1.1
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cs336_basics.measure.results import HOST_SERIES


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def runs_of(record: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Each run's series in a record: every repeated run's, else the record's own."""
    yield from record.get("step_series_runs") or [record]


def per_rank(series: list | None) -> list[list[float]]:
    """A host series as one list per rank (records written before the series were per rank hold one flat list)."""
    if not series:
        return []
    return series if isinstance(series[0], list) else [series]


def _part(series: list[float], steps: int, slow_steps: set[int], slow: bool) -> list[float]:
    return [series[i] for i in range(min(len(series), steps)) if (i in slow_steps) == slow]


def split_by_speed(run: dict[str, Any], slow: float) -> dict[str, Any]:
    """A run's median step, its slow steps (indices) and, per rank, the median host and CPU time and the collector's
    pauses in the slow steps and in the others."""
    steps = run.get("step_ms") or []
    median = _median(steps)
    slow_steps = {i for i, ms in enumerate(steps) if median is not None and ms > slow * median}
    series = zip(*(per_rank(run.get(name)) for name in HOST_SERIES), strict=False)
    summarize = {"host_ms": _median, "host_cpu_ms": _median, "gc_ms": sum}  # the collector's pauses add up
    ranks = [
        {
            part: {
                name: summarize[name](_part(values, len(steps), slow_steps, part == "slow"))
                for name, values in zip(HOST_SERIES, rank, strict=True)
            }
            for part in ("slow", "fast")
        }
        for rank in series
    ]
    return {"steps": len(steps), "median_ms": median, "slow_steps": sorted(slow_steps), "ranks": ranks}


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def describe(record: dict[str, Any], slow: float) -> list[str]:
    """The lines printed for one record."""
    name = record.get("label") or f"{record.get('preset')} {record.get('precision')} {record.get('parallel')}"
    lines = [f"{name}:"]
    for number, run in enumerate(runs_of(record), start=1):
        split = split_by_speed(run, slow)
        if not split["steps"]:
            lines.append(f"  run {number}: no step series")
            continue
        lines.append(
            f"  run {number}: median step {_ms(split['median_ms'])} ms; {len(split['slow_steps'])} of {split['steps']} "
            f"steps slower than {slow:g}x it"
        )
        for rank, parts in enumerate(split["ranks"]):
            s, f = parts["slow"], parts["fast"]
            lines.append(
                f"    rank {rank}: host {_ms(s['host_ms'])} ms in slow steps, {_ms(f['host_ms'])} in the rest; CPU "
                f"{_ms(s['host_cpu_ms'])} / {_ms(f['host_cpu_ms'])}; collector {s['gc_ms']:.1f} / {f['gc_ms']:.1f} ms"
            )
    return lines


def records_in(path: Path) -> list[dict[str, Any]]:
    data = json.loads(path.read_text())
    return data["runs"] if isinstance(data, dict) and "runs" in data else [data]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", type=Path, help="result.json or sweep.json files")
    parser.add_argument("--slow", type=float, default=1.08, help="a step is slow above this many times the median")
    args = parser.parse_args(argv)
    for path in args.files:
        for record in records_in(path):
            print("\n".join(describe(record, args.slow)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
