"""FSDP2's own cost on ONE GPU (no communication): 1.3b, 4 x 2048, BF16 and FP8 (TorchAO tensorwise), one process
plain against one process under FSDP2 (`torchrun --nproc_per_node 1 ... --parallel fsdp`), with and without torchao's
FP8 all-gather and with and without resharding after forward. Each configuration in its own process:

    python3 measure.py LABEL PRECISION MODE [--fp8_all_gather] [--no_fsdp_reshard_after_forward]   (MODE: plain, fsdp)

trains 30 steps as the sweep does (the Trainer's median step time, peak memory, loss: a standard record), then
profiles 2 more steps (GPU busy time, idle time, top kernels and CPU ops). Appends to $OUT/runs.jsonl and
$OUT/profiles.json; run.sh runs every configuration and writes sweep.json.
"""

import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

from cs336_basics.benchmark.amdahl.measure import _is_device_event, gpu_timeline, profiled_steps
from cs336_basics.benchmark.sweep.plan import SweepPoint
from cs336_basics.build import build, plan
from cs336_basics.config import build_config
from cs336_basics.parallel.world import process_group
from cs336_basics.results import result_record
from cs336_basics.training.trainer import Trainer

label, precision, mode, *flags = sys.argv[1:]
out = Path(os.environ["OUT"])
point = SweepPoint("1.3b", 4, precision, False, "default", "sdpa", False)
data = {"train_data": "scratch/tok/train.npy", "val_data": "scratch/tok/val.npy"}
overrides = point.overrides({"data": data}, steps=30)
overrides["train"].update(parallel="fsdp" if mode == "fsdp" else "auto", out_dir=tempfile.mkdtemp())
overrides["train"]["fsdp_reshard_after_forward"] = "--no_fsdp_reshard_after_forward" not in flags
overrides["fp8"]["fp8_all_gather"] = "--fp8_all_gather" in flags
config = build_config(overrides)
train, val = (np.load(f"scratch/tok/{split}.npy", mmap_mode="r") for split in ("train", "val"))


def top(events, device: bool, n: int = 25) -> list:
    totals: dict[str, list] = {}
    for e in events:
        if _is_device_event(e) == device:
            ms = (e.time_range.end - e.time_range.start) / 1e3 if device else e.cpu_time_total / 1e3
            entry = totals.setdefault(e.name[:100], [0, 0.0])
            entry[0] += 1
            entry[1] += ms / 2  # per step (2 profiled)
    return sorted(([name, calls // 2, round(ms, 3)] for name, (calls, ms) in totals.items()), key=lambda r: -r[2])[:n]


with process_group("cuda", 600) as world:
    built = build(plan(config))
    trainer = Trainer(built.model, built.config, train, val, built.device, log=lambda *a: None, parallel=built.parallel)
    result = trainer.train()
    record = result_record(built.config, result, world_size=world.world_size, parallel=built.parallel.mode)
    step_ms = 1e3 * 4 * 2048 / result.tokens_per_sec
    events = profiled_steps(trainer, 2)
    timeline = gpu_timeline(events, 2)
    idle_ms = timeline.idle_ms(step_ms)
    summary = built.parallel.summary_line()
    record.update(
        label=label, status="ok", step_time_ms=step_ms, gpu_busy_ms=timeline.busy_ms, gpu_idle_ms=idle_ms,
        parallel_summary=summary,
    )  # fmt: skip
    with open(out / "runs.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
    profiles_path = out / "profiles.json"
    profiles = json.loads(profiles_path.read_text()) if profiles_path.exists() else {}
    profiles[label] = {"gaps_ms": timeline.gaps[:15], "kernels": top(events, True), "cpu_ops": top(events, False)}
    profiles_path.write_text(json.dumps(profiles, indent=1))
    print(
        f"RESULT {label}: {result.tokens_per_sec:,.0f} tok/s, step {step_ms:.2f} ms, GPU busy "
        f"{timeline.busy_ms:.2f} ms, idle {idle_ms:.2f} ms, peak {result.peak_mem_gib:.2f} GiB, loss {result.loss:.4f} "
        f"[{summary}]",
        flush=True,
    )
