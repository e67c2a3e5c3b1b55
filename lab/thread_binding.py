"""Does the host run a training step's Python faster when the step's two busy threads share one CPU?

A CUDA training step keeps two threads of its process busy in turn: the loop's, which runs the forward and the
optimizer, and autograd's device thread (`pt_autograd_<device>`), which runs the backward while the loop's waits for
it. Left to the scheduler they run on whichever CPUs are free. On the lent machines (KVM guests) a host-bound step
measured much slower that way than with both threads on one CPU
(benchmarks/results/2026-11-29-thread-binding-h200). This study has two parts:

- `probe`: a host-bound eager step (a small model, so the GPU waits for the host) and a pure-Python loop, timed in
  turn for some seconds, with the process on every CPU (`free`), on a set of CPUs (`0`, `0-3`), or with the loop's
  and autograd's threads bound to one CPU after a warm-up (`late`, what the training run below gets):

      python -m lab.thread_binding probe --cpus free --seconds 12 --json drift-free.json

- binding inside real training runs without changing the package: with `lab/thread_binding_site` on PYTHONPATH,
  every training process (`train_h100.py`, a sweep's worker, each torchrun rank) binds its loop thread and autograd's
  device thread to one CPU as soon as autograd's thread starts (the first backward, after the first forward has
  compiled and the compile workers have started with every CPU), one CPU per local rank:

      PYTHONPATH=lab/thread_binding_site:$PYTHONPATH python3 optimize_performance.py ...

  Each bound process prints one `[thread-binding]` line to stderr.

What it found for FSDP2's FP8 step (one rank): binding does not remove its slow speed, which these machines' CPUs
cause by changing speed themselves (benchmarks/results/2026-11-29-fsdp2-host-speed-h200, lab/cpu_speed.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

from lab.cpu_speed import parse_cpus, work_unit

AUTOGRAD_THREAD_PREFIX = "pt_autograd"


def rank_cpu(allowed: set[int] | None = None, local_rank: int | None = None, local_world: int | None = None) -> int:
    """This process's CPU: the first of its local rank's equal share of the CPUs it may run on (torchrun's
    LOCAL_RANK and LOCAL_WORLD_SIZE; one process: the first CPU)."""
    cpus = sorted(os.sched_getaffinity(0) if allowed is None else allowed)
    rank = int(os.environ.get("LOCAL_RANK", 0)) if local_rank is None else local_rank
    world = int(os.environ.get("LOCAL_WORLD_SIZE", 1)) if local_world is None else local_world
    if not 0 <= rank < world:
        raise ValueError(f"local rank {rank} is not in a local world of {world}")
    return cpus[rank * len(cpus) // world]


def thread_names() -> dict[int, str]:
    """This process's threads, by thread id: their names as the kernel knows them."""
    names = {}
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(FileNotFoundError):  # the thread ended meanwhile
            names[int(tid)] = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
    return names


def autograd_threads() -> list[int]:
    return sorted(tid for tid, name in thread_names().items() if name.startswith(AUTOGRAD_THREAD_PREFIX))


def bind_step_threads(cpu: int) -> list[int]:
    """Bind the process's main thread (the loop's) and autograd's device threads to `cpu`; their thread ids."""
    tids = [os.getpid(), *autograd_threads()]
    for tid in tids:
        os.sched_setaffinity(tid, {cpu})
    return tids


def bind_when_autograd_starts(poll_s: float = 0.05, cpu: int | None = None) -> threading.Thread:
    """Watch, from a daemon thread, for autograd's device thread; when it appears, bind it and the process's main
    thread to `cpu` (default: rank_cpu()) and say so on stderr. Threads started later keep every CPU. A run on the CPU
    has no such thread (its backward runs on the loop's thread): nothing is bound there."""
    cpu = rank_cpu() if cpu is None else cpu

    def watch() -> None:
        while not autograd_threads():
            time.sleep(poll_s)
        names = thread_names()
        bound = ", ".join(names.get(tid, str(tid)) for tid in bind_step_threads(cpu))
        print(f"[thread-binding] pid {os.getpid()}: {bound} bound to CPU {cpu}", file=sys.stderr, flush=True)

    watcher = threading.Thread(target=watch, name="lab-thread-bind", daemon=True)
    watcher.start()
    return watcher


def probe(
    cpus: str, seconds: float, device: str = "cuda", steps_per_interval: int = 20, warmup_steps: int = 10
) -> list[dict]:
    """Time a host-bound eager step and a pure-Python loop in turn for `seconds`; one row per interval. `cpus`: free,
    late, or a CPU set for the whole process (cpu_speed.parse_cpus: 5, 0-3 or 0,8)."""
    import torch

    from cs336_basics.build import new_model
    from cs336_basics.config import ModelConfig

    if cpus not in ("free", "late"):
        os.sched_setaffinity(0, set(parse_cpus(cpus)))
    torch.set_num_threads(1)
    shape = ModelConfig(vocab_size=512, context_length=64, dim=256, n_layers=6, n_heads=4, intermediate_size=512)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = new_model(shape, device=device, dtype=dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)  # one launch per tensor: host-bound
    tokens = torch.randint(0, shape.vocab_size, (2, shape.context_length), device=device)

    def step() -> None:
        model(tokens).float().logsumexp(-1).mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def synchronize() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    for _ in range(warmup_steps):
        step()
    synchronize()
    if cpus == "late":
        bind_step_threads(rank_cpu())
    rows: list[dict] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        cpu0 = time.process_time()
        times = []
        for _ in range(steps_per_interval):
            t0 = time.perf_counter()
            step()
            synchronize()
            times.append(1e3 * (time.perf_counter() - t0))
        cpu_ms = 1e3 * (time.process_time() - cpu0) / steps_per_interval
        t0 = time.perf_counter()
        for _ in range(10):
            work_unit(20000)  # four times cpu_speed's default unit: the size this probe's records used
        python_ms = 1e3 * (time.perf_counter() - t0) / 10
        rows.append(dict(step_ms=round(statistics.median(times), 3), cpu_ms_per_step=round(cpu_ms, 3),
                         python_loop_ms=round(python_ms, 3)))  # fmt: skip
    return rows


def summary(rows: list[dict]) -> dict:
    steps = [row["step_ms"] for row in rows]
    loops = [row["python_loop_ms"] for row in rows]
    return dict(intervals=len(rows), step_ms=statistics.median(steps), step_ms_min=min(steps),
                step_ms_max=max(steps), python_loop_ms=statistics.median(loops))  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lab.thread_binding", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("probe", help="time a host-bound step and a Python loop with the threads placed so")
    run.add_argument("--cpus", default="free", help="free, late, or the process's CPUs: 5 or 0-3")
    run.add_argument("--seconds", type=float, default=12.0)
    run.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    run.add_argument("--steps_per_interval", type=int, default=20)
    run.add_argument("--warmup_steps", type=int, default=10)
    run.add_argument("--json", type=Path, help="write the intervals and the summary here")
    args = parser.parse_args(argv)
    rows = probe(args.cpus, args.seconds, args.device, args.steps_per_interval, args.warmup_steps)
    result = dict(cpus=args.cpus, seconds=args.seconds, device=args.device, summary=summary(rows), intervals=rows)
    print(json.dumps({"cpus": args.cpus, **result["summary"]}))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
