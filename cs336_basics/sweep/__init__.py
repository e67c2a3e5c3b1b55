"""Throughput sweep: precision x compile mode x attention x activation checkpointing x batch size x preset x world
size (one GPU, or several under torchrun with DDP or FSDP2).

Every configuration runs in a fresh process (`python -m cs336_basics.sweep.worker`; for a world size above 1,
that many under `torchrun --standalone`), so one configuration's compiled graphs, allocator state, OOM or crash cannot
touch the next. Each result is appended to OUT_DIR/sweep.json (results.append_runs: atomic) as soon as it exists, so a
killed sweep keeps what it measured; sweep.csv and sweep.md are rewritten after every configuration, sweep.png at the
end.

Configurations are ordered so that each group's baseline (BF16 + torch.compile default mode, same preset, batch,
attention, AC and world size) runs first: every record gets its speedup over that baseline when it is appended, and a
run on several GPUs its scaling over the same configuration on one (the one-GPU groups run first).
"""

from cs336_basics.sweep.cli import build_parser, main, parse_options
from cs336_basics.sweep.plan import Grid, Planned, SweepOptions, SweepPoint, expand_grid, plan_sweep
from cs336_basics.sweep.report import format_report, latest_runs, pair_scalings, pair_speedups, write_outputs

__all__ = [
    "Grid",
    "Planned",
    "SweepOptions",
    "SweepPoint",
    "build_parser",
    "expand_grid",
    "format_report",
    "latest_runs",
    "main",
    "pair_scalings",
    "pair_speedups",
    "parse_options",
    "plan_sweep",
    "write_outputs",
]
