"""Where the host's time goes in a training step, and whether the step waits for it.

A step is GPU-bound when the host queues its kernels faster than the GPU runs them, and host-bound when the GPU
waits for the next launch: then its speed follows the machine's CPU, not its GPU. For each configuration this
trains a few steps (compile and warm-up), then times `--steps` steps of the Trainer's own train_step, with no
synchronisation inside them:

  wall_ms        per step, from the first launch to the GPU finishing the last step (tokens/s from it)
  host_ms        per step, the host's time to queue it. Near wall_ms does not by itself say the step is
                 host-bound: when the GPU is the slower, the launch queue fills and the host waits in it too
  gpu_busy_ms, gpu_idle_ms
                 per step, the time some kernel ran on the GPU (the union of the kernels' intervals, from the
                 profiler's CUDA activity over --steps more steps) and the rest of wall_ms: where gpu_idle_ms is a
                 real share of wall_ms, the GPU waits for the host and the step is host-bound
  comm_ms, exposed_comm_ms, collective_calls
                 per step under torchrun (DDP, FSDP2): the time a collective (NCCL) kernel ran, and the part of it
                 when no other kernel ran, which the step's compute did not hide (0 in one process); the host's calls
                 of collectives. Where the host called collectives and the profile holds none of their kernels, both
                 times are None and the line says so, not 0
  batch_ms, forward_ms, optimizer_ms, scaling_update_ms
                 the host's time in the sampler, the (compiled) forward call, the optimizer step and the
                 precision's once-per-step hook (delayed scaling's update); the backward and the rest of the step
                 is what is left, backward_and_rest_ms
  cudagraph_skips
                 graphs that a CUDA-graph compile mode could not capture (their reasons are in the log)
  grad_sync      False where --grad_sync off had DDP skip the gradients' all-reduce in the timed steps: against the
                 same configuration with it, what the reduction costs the step, whatever the profiler sees
  skip_guard_eval
                 True where --skip_guard_eval on had dynamo skip its guard checks in the timed and profiled steps
                 (torch.compiler.set_stance's skip_guard_eval_unsafe, after warm-up: each compiled region has one
                 graph by then): against the same configuration without, what the guard checks cost the step's host
  <field>_ranks  under torchrun, every rank's host_ms, forward_ms, gpu_idle_ms, comm_ms and exposed_comm_ms, rank 0
                 first: an NCCL kernel runs until the last rank joins it, so one rank slower to reach each collective
                 (its host) shows as the others' collective time, and a rank's own line cannot tell which
  top_host_ops   with --top_ops N: the N ops (aten ops, custom ops, compiled regions' wrappers) with the most host
                 time of their own per step, from the profiler's CPU activity over --steps more steps, each step
                 started on an idle GPU so that no launch waits for a full launch queue: what to cut where the step
                 is host-bound (compare a BF16 and an FP8 row)
  python_areas_ms, top_python
                 with --top_python N: the host's time per step in Python functions' own code (cProfile over --steps more
                 steps, each started on an idle GPU) summed by where the code lives (FSDP2, DTensor, dynamo,
                 AOTAutograd, autograd, inductor's generated wrappers, this package, ...; "C functions" is time inside C
                 calls: torch's ops, kernel launches), and the N functions with the most. The ops above say which
                 kernels' launches cost; this says which Python layer around them does. cProfile's own cost falls on
                 Python calls, so compare the rows of one run, not the milliseconds with host_ms

Random token arrays (host time does not depend on the text). All configurations run in this process, one after the
other; compare rows of one run only. Under torchrun every rank measures and rank 0 reports its own (and the
`<field>_ranks` of all).

    python -m lab.host_time --presets gpt2-small --precisions bf16,fp8 --json out.json
    python -m lab.host_time --presets 366m --compile default --compile_wrappers python,cpp   # inductor's wrappers
    torchrun --standalone --nproc_per_node 2 -m lab.host_time --presets 1.3b --compile auto   # DDP, auto's mode
    torchrun --standalone --nproc_per_node 2 -m lab.host_time --presets 1.3b --ddp_bucket_mb 25,100,400
    torchrun --standalone --nproc_per_node 2 -m lab.host_time --presets 1.3b --compile auto \
        --fp8_scaling dynamic,delayed --grad_sync on,off    # what DDP's all-reduce costs each step, per scaling
    torchrun --standalone --nproc_per_node 2 -m lab.host_time --presets 1.3b --parallel fsdp \
        --fp8_path torchao,fused --top_ops 20               # FSDP2's step, each FP8 path
    torchrun --standalone --nproc_per_node 2 -m lab.host_time --presets 1.3b --parallel fsdp \
        --fsdp_reshard_after_forward on,off --skip_guard_eval off,on   # FSDP2's levers on the host
    torchrun --standalone --nproc_per_node 2 -m lab.host_time --presets 1.3b --parallel fsdp --compile auto \
        --top_python 25                                     # which Python layer FSDP2's host-bound FP8 step spends in
"""

from __future__ import annotations

import contextlib
import cProfile
import functools
import itertools
import pstats
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.autograd import DeviceType

from cs336_basics.cli import positive_int
from cs336_basics.config import COMPILE_MODES, COMPILE_WRAPPERS, FP8_PATHS, FP8_SCALINGS, PARALLEL_MODES
from cs336_basics.diagnostics.amdahl.measure import gpu_timeline, is_device_event, profiled_steps
from cs336_basics.diagnostics.measurement import release_memory
from cs336_basics.errors import ConfigError
from cs336_basics.measure.results import run_record
from cs336_basics.measure.timing import StepTimer
from cs336_basics.parallel.world import torchrun_world
from cs336_basics.sweep.plan import parse_choices, parse_on_off, parse_positive_ints
from lab.probe import Record, probe_parser, run_probe, warmed_up_preset

# The fields each rank reports under torchrun (`<field>_ranks`): what tells the rank the others wait for.
PER_RANK = ("host_ms", "forward_ms", "gpu_idle_ms", "comm_ms", "exposed_comm_ms")
PHASES = {"batch": ("sampler", "next_batch"), "optimizer": ("optimizer", "step"),
          "scaling_update": ("converter", "after_optimizer_step")}  # fmt: skip


def _timed(totals: dict[str, float], phase: str, fn):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[phase] += time.perf_counter() - start

    return call


def host_and_wall(trainer: Any, steps: int) -> dict[str, float]:
    """Per step of `steps` warm train steps of `trainer` (a CUDA Trainer), with no synchronisation inside them:
    wall_ms (the GPU's span), host_ms (the host's time to queue them) and each phase's host time (`<phase>_ms`)."""
    totals: dict[str, float] = defaultdict(float)
    # Timing wrappers as instance attributes, removed afterwards: the converter may be a shared object (BF16's).
    patched = [(getattr(trainer, owner), method) for owner, method in PHASES.values()]
    for (target, method), phase in zip(patched, PHASES, strict=True):
        setattr(target, method, _timed(totals, phase, getattr(target, method)))
    step_model = trainer.step_model
    trainer.step_model = _timed(totals, "forward", step_model)
    timer = StepTimer(torch.device("cuda"))  # one span over every timed step: no synchronisation inside it
    torch.cuda.synchronize()
    try:
        started = timer.start()
        host_start = time.perf_counter()
        for _ in range(steps):
            trainer.train_step()
        host_s = time.perf_counter() - host_start
        timer.stop(0, started)
        ((_, wall_s),) = timer.collect()
    finally:
        for target, method in patched:
            delattr(target, method)
        trainer.step_model = step_model
    phases = {f"{phase}_ms": totals[phase] * 1e3 / steps for phase in ("forward", *PHASES)}
    return {"wall_ms": wall_s * 1e3 / steps, "host_ms": host_s * 1e3 / steps, **phases}


def top_host_ops(step: Callable[[], Any], steps: int, n: int, synchronize: Callable[[], Any] = lambda: None):
    """The `n` ops with the most host time of their own over `steps` calls of `step`, per step: (op, self_cpu_ms,
    calls), most first. `synchronize` runs before each step, outside the totals' meaning: a step that starts on an
    idle GPU queues its launches without waiting for the queue to drain, so its ops' time is the host's own."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            synchronize()
            step()
    ranked = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:n]
    return [{"op": e.key, "self_cpu_ms": e.self_cpu_time_total / 1e3 / steps, "calls": e.count / steps} for e in ranked]


# Where a Python function's own time is counted: the first of these path fragments its file holds (pstats names C
# functions' file "~").
PYTHON_AREAS = (
    ("/torch/distributed/fsdp/", "FSDP2"),
    ("/torch/distributed/tensor/", "DTensor"),
    ("/torch/distributed/", "torch.distributed"),
    ("/torch/_dynamo/", "dynamo"),
    ("/torch/_inductor/", "inductor"),
    ("/torch/_functorch/", "AOTAutograd"),
    ("/torch/autograd/", "autograd"),
    ("/torch/nn/", "torch.nn"),
    ("/torch/", "torch, other"),
    ("/triton/", "triton"),
    ("/cs336_basics/", "cs336_basics"),
)
GENERATED = "inductor's generated code"  # the Python wrappers of compiled graphs, written into inductor's cache


def python_area(filename: str, generated_root: str | None = None) -> str:
    """The PYTHON_AREAS name of a pstats file name: GENERATED below `generated_root` (inductor's cache folder),
    "C functions" for built-ins, "other" for the rest."""
    if filename == "~":
        return "C functions"
    path = filename.replace("\\", "/")
    if generated_root and path.startswith(generated_root.replace("\\", "/").rstrip("/") + "/"):
        return GENERATED
    return next((name for fragment, name in PYTHON_AREAS if fragment in path), "other")


def python_profile(step: Callable[[], Any], steps: int, n: int, synchronize: Callable[[], Any] = lambda: None):
    """Per step of `steps` calls of `step` under cProfile: {"python_areas_ms": {area: own time in ms}, most first;
    "top_python": the `n` functions with the most own time, [{"function", "self_ms", "calls"}]}. `synchronize` runs
    before each step, outside the profile (as in top_host_ops)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    generated_root = cache_dir()
    profile = cProfile.Profile()
    for _ in range(steps):
        synchronize()
        profile.enable()
        try:
            step()
        finally:
            profile.disable()
    areas: dict[str, float] = defaultdict(float)
    functions = []
    for (filename, line, name), (_, calls, own_s, _, _) in pstats.Stats(profile).stats.items():
        areas[python_area(filename, generated_root)] += own_s * 1e3 / steps
        where = name if filename == "~" else f"{filename.rsplit('site-packages/', 1)[-1]}:{line}({name})"
        functions.append({"function": where, "self_ms": own_s * 1e3 / steps, "calls": calls / steps})
    functions.sort(key=lambda f: f["self_ms"], reverse=True)
    return {"python_areas_ms": dict(sorted(areas.items(), key=lambda kv: kv[1], reverse=True)),
            "top_python": functions[:n]}  # fmt: skip


def collective_time(events: list[Any], steps: int) -> dict[str, float | None]:
    """Per step, from a profile's events over `steps` steps: comm_ms, the time some collective (NCCL) kernel ran, and
    exposed_comm_ms, the time collectives ran with no other kernel beside them; collective_calls, the host's calls of
    a collective. Calls without a single collective kernel in the profile give None for both times, not 0: the
    profiler did not see those kernels, which is not the same as no communication."""
    collective, others, calls = [], [], 0
    for event in events:
        name = event.name.lower()
        if is_device_event(event):
            (collective if "nccl" in name else others).append(event)
        elif event.device_type == DeviceType.CPU:
            calls += "nccl:" in name
    record: dict[str, float | None] = {"collective_calls": calls / max(1, steps)}
    if calls and not collective:
        return record | {"comm_ms": None, "exposed_comm_ms": None}
    exposed = gpu_timeline(events, steps).busy_ms - gpu_timeline(others, steps).busy_ms
    return record | {"comm_ms": gpu_timeline(collective, steps).busy_ms, "exposed_comm_ms": exposed}


def measure(
    preset: str,
    fp8: bool,
    compile_mode: str,
    warmup: int,
    steps: int,
    top_ops: int = 0,
    compile_wrapper: str = "auto",
    settings: dict[str, dict[str, Any]] | None = None,
    grad_sync: bool = True,
    skip_guard_eval: bool = False,
    top_python: int = 0,
) -> dict[str, Any]:
    """One configuration's record (the module's docstring lists its fields). `settings`: more config settings by
    section (probe.warmed_up_preset). `grad_sync` False, under DDP only: the timed and profiled steps skip the
    gradients' all-reduce (DDP's no_sync; one micro-batch a step, as every preset has), so that their time against
    the same steps with it is what the reduction costs the step, with no profiler needed; not a way to train (the
    replicas part)."""
    compile_counters = torch._dynamo.utils.counters["inductor"]
    skips_before = compile_counters["cudagraph_skips"]
    started = time.perf_counter()  # compile_s: the build and warm-up steps, compile included
    built, trainer = warmed_up_preset(preset, fp8, compile_mode, warmup, compile_wrapper, settings)
    compile_s = time.perf_counter() - started
    if not grad_sync and built.parallel.mode != "ddp":  # --parallel auto resolved to FSDP2
        raise grad_sync_refusal(built.parallel.mode)
    with contextlib.ExitStack() as held:
        if not grad_sync:
            held.enter_context(trainer.step_model.no_sync())
            for _ in range(warmup):  # without its all-reduce, DDP's step is another one to dynamo and CUDA graphs
                trainer.train_step()
        if skip_guard_eval:  # after every warm-up: each compiled region has its graph by then
            held.enter_context(torch.compiler.set_stance(skip_guard_eval_unsafe=True))
        times = host_and_wall(trainer, steps)
        phases = {name: ms for name, ms in times.items() if name not in ("wall_ms", "host_ms")}
        # Kernel times from a profile (the profiler's own host cost does not change them), against the unprofiled wall.
        events = profiled_steps(trainer, steps)
        gpu_busy_ms = gpu_timeline(events, steps).busy_ms
        record = run_record(
            built.config,
            world_size=built.parallel.world.world_size,
            parallel=built.parallel.mode,
            grad_sync=grad_sync,
            skip_guard_eval=skip_guard_eval,
            tokens_per_sec=trainer.tokens_per_step / (times["wall_ms"] / 1e3),
            **times,
            backward_and_rest_ms=times["host_ms"] - sum(phases.values()),
            gpu_busy_ms=gpu_busy_ms,
            gpu_idle_ms=max(times["wall_ms"] - gpu_busy_ms, 0.0),
            **collective_time(events, steps),
            compile_s=compile_s,
            peak_mem_gib=torch.cuda.max_memory_allocated() / 2**30,
            cudagraph_skips=compile_counters["cudagraph_skips"] - skips_before,
            timed_steps=steps,
        )
        if top_ops:
            record["top_host_ops"] = top_host_ops(trainer.train_step, steps, top_ops, torch.cuda.synchronize)
        if top_python:
            record.update(python_profile(trainer.train_step, steps, top_python, torch.cuda.synchronize))
    record.update(every_rank(record))
    del trainer, built
    release_memory()
    return record


def main(argv: list[str] | None = None) -> int:
    parser = probe_parser("lab.host_time", __doc__)
    parser.add_argument(
        "--compile", default="default",
        help=f"compile modes, comma-separated, from auto (each precision's, as its run would resolve it), "
        f"{', '.join(COMPILE_MODES)}",
    )  # fmt: skip
    parser.add_argument("--warmup", type=positive_int, default=8, help="steps before timing (compile included)")
    parser.add_argument("--steps", type=positive_int, default=20, help="timed steps")
    parser.add_argument("--top_ops", type=int, default=0, help="also list the N ops with the most host time per step")
    parser.add_argument(
        "--top_python", type=int, default=0, help="also sum the host's Python time per step by library (FSDP2, "
        "dynamo, ...) and list the N functions with the most (cProfile)",
    )  # fmt: skip
    parser.add_argument(
        "--compile_wrappers", default="auto", help=f"inductor's wrappers, comma-separated, from {COMPILE_WRAPPERS}"
    )
    parser.add_argument(
        "--ddp_bucket_mb", help="under torchrun with DDP: all-reduce bucket sizes in MB, comma-separated (default: "
        "each preset's)",
    )  # fmt: skip
    parser.add_argument(
        "--fp8_scaling", default="auto", help="the FP8 rows' scaling, comma-separated, from auto (the run's default), "
        "dynamic, delayed",
    )  # fmt: skip
    parser.add_argument(
        "--parallel", default="auto", help=f"under torchrun: modes, comma-separated, from {PARALLEL_MODES}"
    )
    parser.add_argument("--fp8_path", default="auto", help=f"the FP8 rows' paths, comma-separated, from {FP8_PATHS}")
    parser.add_argument(
        "--fsdp_reshard_after_forward", default="on", help="under torchrun with FSDP2: on, off or both (on,off): off "
        "keeps each block's gathered weights from its forward to its backward (no second all-gather)",
    )  # fmt: skip
    parser.add_argument(
        "--skip_guard_eval", default="off", help="off, on or both (off,on): on skips dynamo's guard checks in the "
        "timed steps (after warm-up), to measure what they cost the host",
    )  # fmt: skip
    parser.add_argument(
        "--grad_sync", default="on", help="on, off or both (on,off): off, under torchrun with DDP, times the steps "
        "without the gradients' all-reduce (what it costs the step, against on)",
    )  # fmt: skip
    args = parser.parse_args(argv)

    def measure_all(presets: list[str], precisions: list[str]) -> Iterator[Record]:
        modes = parse_choices(args.compile, ("auto", *COMPILE_MODES), "--compile")
        wrappers = parse_choices(args.compile_wrappers, COMPILE_WRAPPERS, "--compile_wrappers")
        buckets = [{}]
        if args.ddp_bucket_mb:
            buckets = [{"ddp_bucket_mb": mb} for mb in parse_positive_ints(args.ddp_bucket_mb, "--ddp_bucket_mb", "25")]
        reshards = parse_on_off(args.fsdp_reshard_after_forward, "--fsdp_reshard_after_forward")
        parallels = [  # DDP does not read the reshard setting: its rows are not repeated for it (auto may be FSDP2)
            {"parallel": p, "fsdp_reshard_after_forward": reshard}
            for p in parse_choices(args.parallel, PARALLEL_MODES, "--parallel")
            for reshard in (reshards[:1] if p == "ddp" else reshards)
        ]
        fp8_choices = [
            {"fp8_scaling": scaling, "fp8_path": path}
            for path in parse_choices(args.fp8_path, FP8_PATHS, "--fp8_path")
            for scaling in parse_choices(args.fp8_scaling, FP8_SCALINGS, "--fp8_scaling")
        ]
        syncs = parse_on_off(args.grad_sync, "--grad_sync")
        if False in syncs:  # refused before any build where no row can run DDP (auto is known only once built)
            if torchrun_world() is None:
                raise grad_sync_refusal("none")
            if not {"ddp", "auto"} & {p["parallel"] for p in parallels}:
                raise grad_sync_refusal("fsdp")
        skips = parse_on_off(args.skip_guard_eval, "--skip_guard_eval")
        grid = itertools.product(presets, modes, wrappers, parallels, buckets, syncs, skips)
        for preset, mode, wrapper, parallel, bucket, sync, skip in grid:
            for precision in precisions:
                for fp8 in fp8_choices if precision == "fp8" else [{}]:
                    settings = {"train": {**parallel, **bucket}, "fp8": fp8}
                    yield measure(preset, precision == "fp8", mode, args.warmup, args.steps, args.top_ops, wrapper,
                                  settings, sync, skip, args.top_python)  # fmt: skip

    return run_probe(args, "the host-time profile", "it measures CUDA training steps", measure_all, describe)


def every_rank(record: Record) -> dict[str, list]:
    """Under torchrun, each PER_RANK field of every rank's record (`<field>_ranks`, in rank order); {} in one
    process. Every rank must call it, as every rank measures."""
    if not (torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1):
        return {}
    gathered: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, {field: record[field] for field in PER_RANK})
    return {f"{field}_ranks": [ranks[field] for ranks in gathered] for field in PER_RANK}


def grad_sync_refusal(mode: str) -> ConfigError:
    return ConfigError(
        f"--grad_sync off skips DDP's gradient all-reduce; this run is {mode!r}, not DDP: start it under torchrun "
        "with --nproc_per_node 2 or more and --parallel ddp (or auto), or leave --grad_sync at on."
    )


def _over_ranks(record: Record) -> str:
    hosts = record.get("host_ms_ranks")
    if not hosts:
        return ""
    exposed = [ms for ms in record["exposed_comm_ms_ranks"] if ms is not None]
    spread = f"; over the ranks: host {min(hosts):.2f}-{max(hosts):.2f} ms (slowest rank {hosts.index(max(hosts))})"
    return spread + (f", exposed collectives {min(exposed):.2f}-{max(exposed):.2f} ms" if exposed else "")


def _collectives(record: Record) -> str:
    if record["comm_ms"] is None:
        return f"collectives: {record['collective_calls']:.0f} calls a step, none of their kernels in the profile"
    return f"collectives {record['comm_ms']:5.2f} ms ({record['exposed_comm_ms']:5.2f} exposed)"


def describe(record: Record) -> str:
    """A record's line, and its top host ops below it."""
    line = (
        f"{record['preset']:>10} {record['precision']:>18} {record['compile']:>15} {record['compile_wrapper']:>6}: "
        f"{record['tokens_per_sec']:>9,.0f} tok/s, "
        + (f"DDP x{record['world_size']} {record['ddp_bucket_mb']} MB buckets, " if record["parallel"] == "ddp" else "")
        + (f"FSDP2 x{record['world_size']}, " if record["parallel"] == "fsdp" else "")
        + ("gathered weights kept for backward, " if not record["fsdp_reshard_after_forward"] else "")
        + ("no gradient all-reduce, " if not record["grad_sync"] else "")
        + ("guard checks skipped, " if record["skip_guard_eval"] else "")
        + f"wall {record['wall_ms']:6.2f} ms, GPU idle {record['gpu_idle_ms']:5.2f} ms, "
        f"{_collectives(record)}, "
        f"host {record['host_ms']:6.2f} ms (forward "
        f"{record['forward_ms']:.2f}, optimizer {record['optimizer_ms']:.2f}, scaling update "
        f"{record['scaling_update_ms']:.2f}), cudagraph skips {record['cudagraph_skips']}" + _over_ranks(record)
    )
    ops = [f"    {op['self_cpu_ms']:8.3f} ms/step {op['calls']:8.1f} calls/step  {op['op']}"
           for op in record.get("top_host_ops", [])]  # fmt: skip
    if "python_areas_ms" in record:
        areas = ", ".join(f"{area} {ms:.2f}" for area, ms in record["python_areas_ms"].items())
        ops.append(f"    Python's own time, ms/step (under cProfile): {areas}")
        ops += [f"    {f['self_ms']:8.3f} ms/step {f['calls']:8.1f} calls/step  {f['function']}"
                for f in record["top_python"]]  # fmt: skip
    return "\n".join([line, *ops])


if __name__ == "__main__":
    sys.exit(main())
