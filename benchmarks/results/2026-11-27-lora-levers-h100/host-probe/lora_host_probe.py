"""Does a LoRA step wait for the host? For a BF16 and an FP8 base of the flags' shape (a fresh random base), after
the sweep's 12 warm-up steps: the host's and the GPU's time per step over 20 steps with no synchronisation inside
(lab.host_time.host_and_wall), the synchronising calls torch's sync debug mode sees in one step,
and a profile of 4 steps: the GPU's gaps and the CUDA runtime calls that held the host longest, with their callers.

    python3 lora_host_probe.py --preset 1.3b --lora_rank 16 --lora_targets attn     (GPU; from the checkout root)
"""

import collections
import sys
import tempfile
import warnings
from pathlib import Path

import torch

from cs336_basics.build import build
from cs336_basics.cli import config_from_args, config_parser
from cs336_basics.diagnostics.amdahl.measure import gpu_timeline, measurement_plan, measurement_tokens
from cs336_basics.diagnostics.measurement import release_memory, train_for_measurement
from cs336_basics.sweep import lora_analysis
from lab.host_time import host_and_wall

TIMED_STEPS, PROFILED_STEPS = 20, 4


def host_and_wall_line(trainer) -> str:
    times = host_and_wall(trainer, TIMED_STEPS)
    phases = ", ".join(f"{k[:-3]} {v:.2f}" for k, v in times.items() if k not in ("wall_ms", "host_ms"))
    return f"wall {times['wall_ms']:.2f} ms/step, host {times['host_ms']:.2f} ms/step; phases {phases}"


def sync_points(trainer) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode(1)
        try:
            trainer.train_step()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    seen = collections.Counter(f"{w.filename}:{w.lineno}: {str(w.message)[:100]}" for w in caught)
    return [f"syncs in one step: {sum(seen.values())}"] + [f"  {n}x {where}" for where, n in seen.most_common(10)]


def profile(trainer) -> list[str]:
    cuda = torch.profiler.ProfilerActivity.CUDA
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, cuda]) as prof:
        for _ in range(PROFILED_STEPS):
            trainer.train_step()
        torch.cuda.synchronize()
    events = list(prof.events())
    timeline = gpu_timeline(events, steps=PROFILED_STEPS)
    big = sum(1 for ms, _, _ in timeline.gaps if ms > 0.05)
    total = sum(ms for ms, _, _ in timeline.gaps) / PROFILED_STEPS
    lines = [f"profile of {PROFILED_STEPS} steps: busy {timeline.busy_ms:.2f} ms/step; gaps over 0.05 ms: {big}, "
             f"total gaps {total:.2f} ms/step"]  # fmt: skip
    lines += [f"  {ms:.3f} ms after {before} before {after}" for ms, before, after in timeline.gaps[:12]]
    runtime = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU and e.name.startswith("cuda")]
    callers = collections.defaultdict(lambda: [0, 0.0])
    for e in runtime:
        if e.time_range.elapsed_us() > 150:
            chain, parent = [], e.cpu_parent
            while parent is not None and len(chain) < 6:
                chain.append(parent.name[:50])
                parent = parent.cpu_parent
            entry = callers[f"{e.name} <- {' <- '.join(chain)}"]
            entry[0] += 1
            entry[1] += e.time_range.elapsed_us() / 1e3
    lines.append(f"runtime calls over 0.15 ms ({PROFILED_STEPS} steps): count, total ms, call <- parents")
    for key, (n, ms) in sorted(callers.items(), key=lambda kv: -kv[1][1])[:15]:
        lines.append(f"  {n:4d} {ms:8.2f}  {key}")
    per_call = collections.defaultdict(float)
    for e in runtime:
        per_call[e.name] += e.time_range.elapsed_us() / 1e3 / PROFILED_STEPS
    top = sorted(per_call.items(), key=lambda kv: -kv[1])[:8]
    lines.append("runtime API ms/step: " + ", ".join(f"{k} {v:.2f}" for k, v in top))
    return lines


def main() -> None:
    args = config_parser("LoRA host probe", prog="lora_host_probe.py").parse_args(sys.argv[1:])
    base = Path(tempfile.mkdtemp()) / "base.pt"
    setattr(args, "finetune.init_from", str(base))
    lora_analysis.write_random_base(args, base)
    plan = measurement_plan(config_from_args(args), 12)
    tokens = measurement_tokens(plan.config)
    for use_fp8 in (False, True):
        built = build(plan.with_fp8(use_fp8))
        trainer, result = train_for_measurement(built, *tokens, lambda message: None)
        mode = built.config.train.compile_mode
        print(f"== {'FP8' if use_fp8 else 'BF16'}: {result.tokens_per_sec:,.0f} tok/s (trainer), compile mode {mode}")
        for line in [host_and_wall_line(trainer), *sync_points(trainer), *profile(trainer)]:
            print(f"   {line}", flush=True)
        del trainer, built
        release_memory()


if __name__ == "__main__":
    main()
