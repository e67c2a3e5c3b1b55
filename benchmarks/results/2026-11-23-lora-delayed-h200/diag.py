"""Where an FP8-base LoRA step's kernel time goes (exploration script of this folder's README; not part of the package).

Runs lora_analysis's command line, but for the FP8 base alone: trains, times and profiles it as the analysis does, and
writes the profiled step's kernels grouped by name and by family to $OUT/w/diag/<TAG>-<scaling>.json. ROWMODE (the
2-layer comparison) changes how delayed scaling records an output gradient's amax: "rows" (the package's code), "cols"
(per feature, over tokens) or "chunks" (per 128 features).
"""

import collections
import json
import os
import re
import statistics
import sys

import numpy as np

import cs336_basics.benchmark.lora_analysis as la
from cs336_basics.benchmark.amdahl.measure import _is_device_event, gpu_timeline, profiled_steps
from cs336_basics.precision.fused import scaling
from cs336_basics.timing import time_calls_ms

OUT = os.environ.get("OUT", "/tmp") + "/w/diag"
MODE = os.environ.get("ROWMODE", "rows")


def family(name: str) -> str:
    if "triton_" in name:
        kind = re.match(r"triton_(\w+?)_", name)
        return "triton_" + (kind.group(1) if kind else "?")
    return name[:50]


def fp8_base_only(config, steps=12, timing_steps=10, log=print):
    from cs336_basics.build import build, plan
    from cs336_basics.data import prepare_data
    from cs336_basics.training.measure import release_memory, train_for_measurement

    fp8_plan = plan(config.replace(train={"max_steps": steps, "log_every": steps}).with_fp8(True))
    data = prepare_data(fp8_plan.config.data, fp8_plan.config.model.vocab_size)
    built = build(fp8_plan)
    tokens = np.asarray(data.train), np.asarray(data.val)
    trainer, result = train_for_measurement(built.model, built.config, *tokens, fp8_plan.device, log)
    step_ms = statistics.median(time_calls_ms(trainer.train_step, timing_steps))
    events = profiled_steps(trainer)
    kernels = [e for e in events if _is_device_event(e)]
    by_name, by_family = collections.defaultdict(lambda: [0, 0.0]), collections.defaultdict(lambda: [0, 0.0])
    for e in kernels:
        us = e.time_range.end - e.time_range.start
        for table, key in ((by_name, e.name), (by_family, family(e.name))):
            table[key][0] += 1
            table[key][1] += us
    record = {
        "scaling": fp8_plan.config.fp8.fp8_scaling,
        "tokens_per_sec": result.tokens_per_sec,
        "step_ms": step_ms,
        "kernels": len(kernels),
        "kernel_ms": sum(us for _, us in by_name.values()) / 1e3,
        "idle_ms": gpu_timeline(events).idle_ms(step_ms),
        "families": sorted(([k, n, us / 1e3] for k, (n, us) in by_family.items()), key=lambda r: -r[2]),
        "top": sorted(([k[:160], n, us / 1e3] for k, (n, us) in by_name.items()), key=lambda r: -r[2])[:60],
    }
    tag = os.environ.get("TAG", "x")
    os.makedirs(OUT, exist_ok=True)
    with open(f"{OUT}/{tag}-{record['scaling']}.json", "w") as f:
        json.dump(record, f, indent=1)
    print(
        f"== {tag} {record['scaling']}: {result.tokens_per_sec:,.0f} tok/s step {step_ms:.1f} ms kernels "
        f"{len(kernels)} busy {record['kernel_ms']:.1f} idle {record['idle_ms']:.1f}"
    )
    for name, n, ms in record["families"][:12]:
        print(f"   {name:50s} {n:5d} {ms:8.2f} ms")
    del trainer, built, events
    release_memory()
    return []


_package_cast = scaling.SiteScaling.cast


def cast(self, x, role, record):
    if not self.delayed or role != scaling.GRAD or MODE == "rows":
        return _package_cast(self, x, role, record)
    dtype, scale = self.dtypes[role], self.scale[role]
    if record:
        magnitude = x.reshape(-1, x.shape[-1]).abs()
        magnitude = magnitude.t() if MODE == "cols" else magnitude.reshape(-1, 128)
        saturated = (magnitude.float() * scale > scaling.fp8_max(dtype)).sum(dim=-1)
        self.accumulate(role, magnitude.amax(dim=-1), saturated)
    return scaling.cast_to_fp8(x, scale, dtype), self.scale_inv(role)


scaling.SiteScaling.cast = cast
la.analyse_lora = fp8_base_only
la.format_lora_table = lambda records: ""
sys.exit(la.main(sys.argv[1:]))
