"""Run a function on two gloo ranks (torch.multiprocessing.spawn, on the CPU) and collect what each returned: for
tests of code that calls torch.distributed collectives itself. `work` must be a module-level function (spawn pickles
it), called with the rank."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def on_two_gloo_ranks(work: Callable[[int], Any], folder: Path) -> list[Any]:
    """`work(rank)` on ranks 0 and 1 of a gloo group; their results, in rank order."""
    out = str(folder / "result")
    torch.multiprocessing.spawn(_rank, args=(str(folder / "init"), out, work), nprocs=2)
    return [torch.load(f"{out}.{rank}", weights_only=False) for rank in range(2)]


def _rank(rank: int, init_file: str, out: str, work: Callable[[int], Any]) -> None:
    """spawn's target: whatever `work` built is freed before the group is destroyed (a DDP reducer outliving it
    aborted the process at exit in 1 run of 6)."""
    import gc

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        torch.save(work(rank), f"{out}.{rank}")
        gc.collect()
        dist.barrier()
    finally:
        dist.destroy_process_group()
