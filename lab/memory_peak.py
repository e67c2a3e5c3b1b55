"""What is alive at a training step's peak GPU memory, and where it was allocated.

For each configuration this trains a few steps (compile and warm-up), then records one more step with torch's
allocator history (`torch.cuda.memory._record_memory_history`, Python stacks). Replaying its allocations and frees
finds the moment of the step's peak; the blocks allocated in the step and still alive then are grouped by size and
allocation site (the first frames of their Python stack, with the source line when it is inductor's generated code,
which names the buffer: `buf4 = empty_strided_cuda((16384, 50304), ..., torch.float8_e5m2)`). Memory allocated
before the step (weights, optimizer state) is reported as one number.

    python -m lab.memory_peak --presets gpt2-small --precisions bf16,fp8 --json out.json
"""

from __future__ import annotations

import linecache
import sys
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import torch

from cs336_basics.cli import positive_int
from cs336_basics.compiled import PROFILED_WRAPPER
from cs336_basics.diagnostics.measurement import release_memory
from cs336_basics.measure.results import run_record
from lab.probe import Record, probe_parser, run_probe, warmed_up_preset

MIB = 2**20
TORCH_INTERNALS = ("/torch/", "/site-packages/triton/")  # frames that say how, not where


def allocation_site(event: dict[str, Any], frames: int = 3) -> str:
    """The first `frames` Python frames of an allocation outside torch's own code; a generated file's frame also
    shows its source line (inductor's generated code names the buffer it allocates)."""
    sites = []
    for frame in event.get("frames", []):
        filename = frame["filename"]
        generated = "torchinductor" in filename
        if not generated and any(part in filename for part in TORCH_INTERNALS):
            continue
        site = f"{filename.rsplit('/', 1)[-1]}:{frame['line']}:{frame['name']}"
        source = linecache.getline(filename, frame["line"]).strip() if generated else ""
        sites.append(f"{site} [{source[:100]}]" if source else site)
        if len(sites) == frames:
            break
    return " < ".join(sites) or "<no Python frame>"


def live_at_peak(trace: list[dict[str, Any]], start_bytes: int) -> tuple[int, int, list[dict[str, Any]]]:
    """Replay an allocator trace that began with `start_bytes` allocated: (peak bytes, index of the event that reached
    it, the blocks allocated in the trace and alive at that moment). A block counts until its free completes."""
    live: dict[int, dict[str, Any]] = {}
    current = peak = start_bytes
    peak_index, at_peak = -1, []
    for index, event in enumerate(trace):
        if event["action"] == "alloc":
            live[event["addr"]] = event
            current += event["size"]
        elif event["action"] == "free_completed":
            current -= event["size"]
            live.pop(event["addr"], None)
        if current > peak:
            peak, peak_index, at_peak = current, index, list(live.values())
    return peak, peak_index, at_peak


def grouped(blocks: list[dict[str, Any]], top: int) -> list[dict[str, Any]]:
    """The blocks grouped by (size, allocation site), the largest totals first."""
    groups: dict[tuple[int, str], int] = defaultdict(int)
    for block in blocks:
        groups[(block["size"], allocation_site(block))] += 1
    rows = [
        {"total_mib": size * count / MIB, "count": count, "size_mib": size / MIB, "site": site}
        for (size, site), count in groups.items()
    ]
    return sorted(rows, key=lambda row: -row["total_mib"])[:top]


def allocation_trace(work: Callable[[], Any], max_entries: int = 1_000_000) -> tuple[int, list[dict[str, Any]], Any]:
    """(bytes allocated before, this GPU's allocator trace with Python stacks, work's result) of running `work`."""
    torch.cuda.synchronize()
    start = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(max_entries=max_entries, stacks="python")
    try:
        result = work()
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    return start, snapshot["device_traces"][torch.cuda.current_device()], result


def measure(preset: str, fp8: bool, compile_mode: str, warmup: int, top: int) -> dict[str, Any]:
    built, trainer = warmed_up_preset(preset, fp8, compile_mode, warmup, compile_wrapper=PROFILED_WRAPPER)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start, trace, _ = allocation_trace(trainer.train_step)
    peak, index, blocks = live_at_peak(trace, start)
    record = run_record(
        built.config,
        peak_mem_gib=torch.cuda.max_memory_allocated() / 2**30,
        replayed_peak_gib=peak / 2**30,
        before_step_gib=start / 2**30,
        in_step_at_peak_gib=sum(block["size"] for block in blocks) / 2**30,
        peak_event=f"{index} of {len(trace)}",
        peak_site=allocation_site(trace[index]) if index >= 0 else None,
        live_at_peak=grouped(blocks, top),
    )
    del trainer, built
    release_memory()
    return record


def main(argv: list[str] | None = None) -> int:
    parser = probe_parser("lab.memory_peak", __doc__)
    parser.add_argument("--compile_mode", default="default", help="torch.compile mode of the trained model")
    parser.add_argument("--warmup", type=positive_int, default=3, help="steps before the recorded one")
    parser.add_argument("--top", type=positive_int, default=12, help="groups of live blocks to report")
    args = parser.parse_args(argv)

    def measure_all(presets: list[str], precisions: list[str]) -> Iterator[Record]:
        for preset in presets:
            for precision in precisions:
                yield measure(preset, precision == "fp8", args.compile_mode, args.warmup, args.top)

    return run_probe(args, "the memory-peak probe", "it records CUDA allocations", measure_all, describe)


def describe(record: Record) -> str:
    """A record's summary line, and the groups of blocks alive at its peak below it."""
    line = (
        f"\n{record['preset']} {record['precision']}: peak {record['peak_mem_gib']:.3f} GiB; "
        f"{record['before_step_gib']:.3f} allocated before the step, {record['in_step_at_peak_gib']:.3f} "
        f"allocated in it and alive at event {record['peak_event']} ({record['peak_site']})"
    )
    rows = [f"  {row['total_mib']:9.1f} MiB = {row['count']:3d} x {row['size_mib']:8.2f} MiB  {row['site']}"
            for row in record["live_at_peak"]]  # fmt: skip
    return "\n".join([line, *rows])


if __name__ == "__main__":
    sys.exit(main())
