"""What the checkpoint checksums cost, on a preset's real checkpoint (model, fp32 masters, AdamW moments).

Writes the checkpoint's payload as the trainer does (save_torch_file: atomic, fsynced, CRC-32s on) and, for comparison,
the same write with torch.save's CRC-32s off; reads it with read_checkpoint (CRC-32s checked) and with torch.load
alone. Each timing is the median of --repeats. The file is read back right after it was written, so reads come from
the page cache: the check's own CPU time, not the disk's.

    python -m lab.checkpoint_checksum --preset 366m --dir /tmp --json out.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from cs336_basics.config_layers import build_config
from cs336_basics.errors import run_program
from cs336_basics.files.atomic import atomic_write
from cs336_basics.files.integrity import save_torch_file, save_with_checksums, verify_zip
from cs336_basics.files.output_paths import check_output_path
from cs336_basics.measure.results import run_record, write_results
from cs336_basics.model import TransformerLM
from cs336_basics.optim import MasterWeightAdamW
from cs336_basics.training.checkpoint import checkpoint_payload, model_state, read_checkpoint


def _median_s(actions: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """The median seconds of each action, the actions taken in turn `repeats` times (so that a drift of the machine
    touches all of them alike)."""
    times: dict[str, list[float]] = {name: [] for name in actions}
    for _ in range(repeats):
        for name, action in actions.items():
            start = time.perf_counter()
            action()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def measure(preset: str, folder: Path, repeats: int) -> dict[str, Any]:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = build_config({"preset": preset, "train": {"dtype": "bfloat16"}, "fp8": {"use_fp8": False}}, {}, device)
    torch.manual_seed(0)
    model = TransformerLM(config.model).to(device, torch.bfloat16)
    optimizer = MasterWeightAdamW(model.named_parameters(), lr=1e-4, weight_decay=0.1)
    for p in model.parameters():  # one real step, so the moments hold values, not zeros
        p.grad = torch.randn_like(p) * 1e-3
    optimizer.step(max_grad_norm=1.0)
    # What save_checkpoint writes; save_torch_file is its write (atomic, fsynced, CRC-32s on).
    payload = checkpoint_payload(
        model=model_state(model), optimizer=optimizer.state_dict(), step=1, config=config.to_dict()
    )
    path = folder / "checkpoint.pt"
    writes = _median_s(
        {
            "off": lambda: atomic_write(path, lambda f: save_with_checksums(payload, f, crc32=False)),
            "on": lambda: save_torch_file(path, payload),
        },
        repeats,
    )
    write_on, write_off = writes["on"], writes["off"]
    size_gib = path.stat().st_size / 2**30
    reads = _median_s(
        {
            "load": lambda: torch.load(path, map_location="cpu", weights_only=True),
            "verify": lambda: verify_zip(path),
            "checked": lambda: read_checkpoint(path),
        },
        repeats,
    )
    load_only, verify, read_checked = reads["load"], reads["verify"], reads["checked"]
    path.unlink()
    print(
        f"{preset}: {size_gib:.2f} GiB; write {write_on:.2f} s with CRC-32s, {write_off:.2f} s without; "
        f"check {verify:.2f} s; torch.load {load_only:.2f} s, read_checkpoint (checked) {read_checked:.2f} s",
        flush=True,
    )
    return run_record(
        config,
        compile=False,
        checkpoint_gib=size_gib,
        write_s_with_crc32=write_on,
        write_s_without_crc32=write_off,
        verify_s=verify,
        torch_load_s=load_only,
        read_checkpoint_s=read_checked,
        repeats=repeats,
        device=device,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lab.checkpoint_checksum",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--preset", default="366m")
    parser.add_argument("--dir", help="where to write the checkpoint (default: a temporary folder)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write {gpu, torch, torchao, command, runs} here")
    args = parser.parse_args(argv)

    def run() -> int:
        if args.json:
            check_output_path(args.json, "--json", folder=False)
        with tempfile.TemporaryDirectory(dir=args.dir) as folder:
            record = measure(args.preset, Path(folder), args.repeats)
        if args.json:
            write_results(args.json, [record])
        return 0

    return run_program(run)


if __name__ == "__main__":
    sys.exit(main())
