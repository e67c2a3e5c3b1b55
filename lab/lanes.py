"""Run a list of GPU jobs on one host's GPUs, as many at once as the GPUs allow, each on GPUs of its own.

A device session's time counts by the clock, whatever the number of GPUs: on a 4-GPU host, four one-GPU jobs that
each need the GPU but little of the host (steps under CUDA graphs, tests) cost what one does. A jobs file has one
job per line, `NAME GPUS COMMAND`:

    graphs-bf16   1   python3 optimize_performance.py --presets 366m --precisions bf16 --out_dir $JOB_OUT
    ddp2          2   python3 optimize_performance.py --presets 1.3b --world_sizes 2 --parallel ddp --out_dir $JOB_OUT
    nographs-fp8  1!  python3 optimize_performance.py --presets 366m --compile default --out_dir $JOB_OUT

GPUS is how many GPUs the job takes; with `!` it also runs alone on the host: a step that waits for the host (no CUDA
graphs) is slowed by what else runs on the host, so its timing compares only with the host to itself
(2026-11-28-rope-one-launch-ab: beside other jobs, one compiled graph's host time differed by a quarter between two
processes). Jobs start in file order, each when its GPUs are free (a later job never overtakes an earlier one that
waits). Each runs with bash in the current folder, `CUDA_VISIBLE_DEVICES` set to its GPUs and `JOB_OUT` to its own
folder under `--out`, its output in `--out/NAME.log`; `lanes.json` there records each job's GPUs, start, end and exit
status. Blank lines and lines starting with # are skipped.

A job past `--timeout_s` is stopped: a SIGTERM (a sweep then writes what finished and stops its own worker), then a
SIGKILL after STOP_GRACE_S. A Ctrl-C or a SIGTERM (`timeout`'s) stops the lanes: no job starts after it, and each
running one is stopped so. Each job runs in a session of its own, out of reach of a signal to the lanes' process
group: before the lanes passed the stop on, a job outlived them and timed its steps beside the next command's
(2026-11-28-fsdp2-x4-4xh200). Under `timeout`, leave STOP_GRACE_S between its limit and the device command's.

    python -m lab.lanes --gpus 4 --out $OUT/lanes jobs.txt
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cs336_basics.cli import positive_int
from cs336_basics.errors import ConfigError, run_program
from cs336_basics.sweep.run import TORCHRUN_GRACE_S, run_logged
from cs336_basics.training.signals import terminate_raises

_NAME = re.compile(r"[A-Za-z0-9._-]+")
# A stopped job's time to exit after its SIGTERM: a sweep in it gives its torchrun worker TORCHRUN_GRACE_S.
STOP_GRACE_S = TORCHRUN_GRACE_S + 15


@dataclass
class Job:
    name: str
    gpus: int
    alone: bool
    command: str
    assigned: list[int] = field(default_factory=list)
    started_s: float | None = None  # seconds since the lanes began
    ended_s: float | None = None
    returncode: int | None = None
    timed_out: bool = False
    stopped: bool = False  # running when the lanes were stopped (Ctrl-C, SIGTERM)


def parse_jobs(text: str, gpus: int) -> list[Job]:
    """The jobs of a jobs file (see the module's docstring); ConfigError naming the line for a malformed one."""
    jobs, names = [], set()
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = line.split(None, 2)
        if len(parts) < 3 or not re.fullmatch(r"[1-9][0-9]*!?", parts[1]) or not _NAME.fullmatch(parts[0]):
            raise ConfigError(
                f"jobs line {number}: expected 'NAME GPUS COMMAND' (GPUS a count, ! to run alone), not {line!r}"
            )
        name, count = parts[0], int(parts[1].rstrip("!"))
        if name in names:
            raise ConfigError(f"jobs line {number}: the name {name!r} is taken (each job's log and folder carry it)")
        if count > gpus:
            raise ConfigError(f"jobs line {number}: {name} needs {count} GPUs; this host has {gpus} (--gpus)")
        names.add(name)
        jobs.append(Job(name, count, parts[1].endswith("!"), parts[2].strip()))
    if not jobs:
        raise ConfigError("the jobs file holds no job")
    return jobs


def check_gpus(gpus: int) -> None:
    """Refuse more GPUs than this host has (where it has any: the CPU runs stand-in jobs), before any job starts."""
    import torch

    visible = torch.cuda.device_count()
    if visible and gpus > visible:
        raise ConfigError(f"--gpus {gpus}, but this host has {visible} CUDA GPUs: pass --gpus {visible} or fewer")


def run_lanes(jobs: list[Job], gpus: int, out: Path, timeout_s: float, log=print, poll_s: float = 0.2) -> list[Job]:
    """Run `jobs` on GPUs 0..gpus-1 as described in the module's docstring; returns them with their outcome."""
    out.mkdir(parents=True, exist_ok=True)
    free = list(range(gpus))
    running: set[str] = set()  # the jobs whose threads have not finished
    lock = threading.Lock()
    stop = threading.Event()
    t0 = time.perf_counter()

    def run(job: Job) -> None:
        job_out = out / job.name
        job_out.mkdir(exist_ok=True)
        env = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, job.assigned)), "JOB_OUT": str(job_out)}
        job.returncode, job.timed_out = run_logged(
            ["bash", "-c", job.command], out / f"{job.name}.log", timeout_s, STOP_GRACE_S, env, stop
        )
        with lock:
            job.ended_s = time.perf_counter() - t0
            free.extend(job.assigned)
            free.sort()
            running.discard(job.name)
        log(f"[lanes] {job.name} ended: exit {job.returncode}{' (timed out)' if job.timed_out else ''}, "
            f"{job.ended_s - job.started_s:.0f} s")  # fmt: skip

    try:
        for job in jobs:
            while True:
                with lock:
                    alone_running = any(j.alone for j in jobs if j.name in running)
                    fits = len(free) >= job.gpus and not alone_running and not (job.alone and running)
                    if fits:
                        job.assigned, free[:] = free[: job.gpus], free[job.gpus :]
                        job.started_s = time.perf_counter() - t0
                        thread = threading.Thread(target=run, args=(job,))
                        running.add(job.name)
                        log(f"[lanes] {job.name} started on GPU {','.join(map(str, job.assigned))}"
                            f"{' alone' if job.alone else ''}")  # fmt: skip
                        thread.start()
                        break
                time.sleep(poll_s)
        _wait_for_all(running, lock, poll_s)
    except BaseException:  # Ctrl-C, SIGTERM (see main): no job may outlive the lanes
        with lock:
            for job in jobs:
                job.stopped = job.name in running
        log(f"[lanes] stopping the running jobs (each has {STOP_GRACE_S} s to exit after its SIGTERM) ...")
        stop.set()
        _wait_for_all(running, lock, poll_s)
        raise
    finally:
        (out / "lanes.json").write_text(json.dumps({"gpus": gpus, "jobs": [asdict(j) for j in jobs]}, indent=2) + "\n")
    return jobs


def _wait_for_all(running: set[str], lock: threading.Lock, poll_s: float) -> None:
    """Until every started job's thread has finished. Polled, not Thread.join(): a signal's exception raised inside
    join() left the thread marked as stopped while it still ran (CPython 3.11), and the interpreter then exits
    without waiting for it, its job never stopped."""
    while True:
        with lock:
            if not running:
                return
        time.sleep(poll_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.lanes", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("jobs", type=Path, help="the jobs file")
    parser.add_argument("--gpus", type=positive_int, required=True, help="the host's GPUs to use: 0..N-1")
    parser.add_argument("--out", type=Path, required=True, help="folder for each job's log, folder and lanes.json")
    parser.add_argument("--timeout_s", type=float, default=600.0, help="each job's limit")
    args = parser.parse_args(argv)

    def body() -> int:
        check_gpus(args.gpus)
        try:
            with terminate_raises():
                done = run_lanes(parse_jobs(args.jobs.read_text(), args.gpus), args.gpus, args.out, args.timeout_s)
        except KeyboardInterrupt as exc:
            print(f"[lanes] stopped ({exc or 'Ctrl-C'}): {args.out}/lanes.json records each job", file=sys.stderr)
            return getattr(exc, "exit_code", 130)
        for job in done:
            print(f"{job.name:>24}  GPU {','.join(map(str, job.assigned)):<8} {job.started_s:7.0f} -> "
                  f"{job.ended_s:7.0f} s  exit {job.returncode}{' (timed out)' if job.timed_out else ''}")  # fmt: skip
        return 0 if all(job.returncode == 0 for job in done) else 1

    return run_program(body)


if __name__ == "__main__":
    sys.exit(main())
