"""How fast is each CPU of this machine right now?

On the lent machines (KVM guests) one thread's speed is not a constant: a fixed piece of Python work took about
0.6 ms or about 1.2 ms on one CPU, in stretches of seconds, with nothing else of ours running, each CPU at its own
times, and more often the more of the guest's CPUs were busy (benchmarks/results/2026-11-29-fsdp2-host-speed-h200).
A step bound by its host then has two speeds whatever its code does. `probe` shows whether a machine does this: one
process per CPU asked for, each bound to its CPU, times a fixed work unit back to back for `--seconds` (0: until
SIGINT or SIGTERM, to run beside a training run) and writes each CPU's samples, their one-second medians and a
summary (the share of samples over 1.5 times the fastest tenth's time of the fastest CPU):

    python -m lab.cpu_speed probe --cpus 15 --seconds 30 --json speed.json
    python -m lab.cpu_speed probe --cpus 0-15 --seconds 15 --json all.json   # every CPU busy at once
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import statistics
import time
from pathlib import Path

STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def work_unit(size: int = 5000) -> int:
    """Fixed interpreter work (a dict of `size` entries built and read): what a host-bound step's Python does, in
    small."""
    words = {i: str(i) for i in range(size)}
    return sum(len(word) for word in words.values())


def sample(cpu: int, seconds: float) -> dict:
    """Bind this process to `cpu` and time `work_unit` back to back for `seconds` (0: until SIGTERM or SIGINT);
    the samples as (start time, ms) pairs, and the CPUs the process ran on."""
    os.sched_setaffinity(0, {cpu})
    stopping = []
    for signum in STOP_SIGNALS:
        signal.signal(signum, lambda *_: stopping.append(True))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # a worker inherits probe's mask
    samples = []
    end = time.time() + seconds if seconds > 0 else float("inf")
    while not stopping and time.time() < end:
        start = time.time()
        work_unit()
        samples.append((round(start, 4), round(1e3 * (time.time() - start), 4)))
    return dict(cpu=cpu, affinity=sorted(os.sched_getaffinity(0)), samples=samples)


def per_second(samples: list[tuple[float, float]]) -> list[dict]:
    """The samples in one-second bins from the first: each bin's median and count."""
    bins: dict[int, list[float]] = {}
    first = samples[0][0] if samples else 0.0
    for start, ms in samples:
        bins.setdefault(int(start - first), []).append(ms)
    return [dict(second=k, median_ms=round(statistics.median(v), 4), n=len(v)) for k, v in sorted(bins.items())]


def summary(run: dict, fast_ms: float | None = None) -> dict:
    """One CPU's probe in short: its median work unit, its fastest tenth's, and the share of samples over 1.5 times
    `fast_ms` (by default its own fastest tenth's; pass the fastest CPU's when a CPU may have been slow throughout)."""
    times = sorted(ms for _, ms in run["samples"])
    if not times:  # stopped before its first sample
        return dict(cpu=run["cpu"], n=0, median_ms=None, p10_ms=None, slow_share=None)
    fast = times[len(times) // 10]
    slow = 1.5 * (fast_ms or fast)
    return dict(cpu=run["cpu"], n=len(times), median_ms=round(statistics.median(times), 4), p10_ms=fast,
                slow_share=round(sum(ms > slow for ms in times) / len(times), 3))  # fmt: skip


def _sample_into(queue, index: int, cpu: int, seconds: float) -> None:
    queue.put((index, sample(cpu, seconds)))


def probe(cpus: list[int], seconds: float) -> list[dict]:
    """`sample` on each CPU at once, one process each; their records, in the order asked. With `seconds` 0 they run
    until this process gets SIGINT or SIGTERM, which it passes on."""
    context = multiprocessing.get_context("fork")
    queue = context.SimpleQueue()
    workers = [context.Process(target=_sample_into, args=(queue, i, cpu, seconds)) for i, cpu in enumerate(cpus)]
    if seconds <= 0:
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # from now on a stop waits for sigwait below
    for worker in workers:
        worker.start()
    if seconds <= 0:
        signal.sigwait(STOP_SIGNALS)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for worker in workers:
            os.kill(worker.pid, signal.SIGTERM)
    runs = dict(queue.get() for _ in workers)  # read before joining: a worker's record fills the pipe
    for worker in workers:
        worker.join()
    return [runs[i] for i in range(len(workers))]


def parse_cpus(spec: str) -> list[int]:
    """CPUs as written on the command line: 15, 0-3 or 0,8."""
    cpus: list[int] = []
    for part in spec.split(","):
        first, _, last = part.partition("-")
        cpus += range(int(first), int(last or first) + 1)
    return cpus


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lab.cpu_speed", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("probe", help="time a fixed work unit on each CPU asked for, all at once")
    run.add_argument("--cpus", default="0", help="15, 0-3 or 0,8: one probing process on each")
    run.add_argument("--seconds", type=float, default=30.0, help="0: until interrupted (SIGINT or SIGTERM)")
    run.add_argument("--json", type=Path, required=True)
    args = parser.parse_args(argv)
    runs = probe(parse_cpus(args.cpus), args.seconds)
    fastest = min((row["p10_ms"] for row in map(summary, runs) if row["n"]), default=None)
    summaries = [summary(r, fastest) for r in runs]
    seconds = [dict(cpu=r["cpu"], bins=per_second(r["samples"])) for r in runs]
    args.json.write_text(json.dumps(dict(summary=summaries, per_second=seconds, runs=runs)) + "\n")
    for row in summaries:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
