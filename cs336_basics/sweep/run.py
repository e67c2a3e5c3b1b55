"""Running the sweep: every configuration in a fresh worker process (its own session, killed whole on timeout or
Ctrl-C), or for a world size above 1 in that many worker processes under torchrun, each record appended to sweep.json
as soon as it exists; and the Amdahl analysis per preset/batch."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cs336_basics.config_layers import merge_layers
from cs336_basics.data import prepare_data
from cs336_basics.measure.results import append_runs, format_or_na, run_record
from cs336_basics.sweep.plan import Planned, SweepOptions, on_off
from cs336_basics.sweep.report import (
    _pct,
    _status_cell,
    combine_repeats,
    latest_runs,
    scaling_for,
    speedup_for,
    write_outputs,
)
from cs336_basics.sweep.worker import classify_failure, last_line

# torchrun gives its ranks this long to exit after its SIGTERM before it kills them (its default); then some margin.
TORCHRUN_GRACE_S = 30 + 15


def worker_command(spec: dict[str, Any], out_path: Path) -> list[str]:
    return [sys.executable, "-m", "cs336_basics.sweep.worker", "--spec", json.dumps(spec), "--out", str(out_path)]


def torchrun_command(command: list[str], nproc: int) -> list[str]:
    """`command` (`python -m module ARGS` or `python script ARGS`) run as nproc processes of this machine, one per GPU,
    by torchrun: `python -m torch.distributed.run` is what the `torchrun` script runs, and naming this interpreter
    keeps the sweep's environment. `--standalone` gives each launch its own rendezvous on a free local port."""
    launcher = [command[0], "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    return [*launcher, *command[1:]]


def launch_command(planned: Planned, out_path: Path) -> list[str]:
    """How one configuration is started: the worker, under torchrun for a world size above 1."""
    command = worker_command(planned.spec, out_path)
    n = planned.point.world_size
    return torchrun_command(command, n) if n > 1 else command


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # so the package imports from any working directory
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env["TQDM_DISABLE"] = "1"  # no progress bar in the log files
    return env


def _kill_group(proc: subprocess.Popen, grace_s: float = 0.0) -> None:
    """Kill the worker and anything it started (torch.compile's compile workers), all in its own session. torchrun
    starts each rank in a session of its own, out of reach of that kill: with `grace_s`, the group first gets a
    SIGTERM, which torchrun passes on to its ranks (killing them if they do not exit in 30 s), and that long to exit,
    the whole group, not only its leader (a `bash -c` running two commands dies at once; the one it runs may not)."""
    try:
        if grace_s and _group_alive(proc):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while _group_alive(proc) and time.monotonic() < deadline:
                time.sleep(0.1)
    finally:  # also when a second Ctrl-C cuts the grace short
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


def _group_alive(proc: subprocess.Popen) -> bool:
    proc.poll()  # reaps the leader once it has exited: unreaped, it would count as a member of the group
    try:
        os.killpg(proc.pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _tail(path: Path, n_bytes: int = 20000) -> str:
    try:
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - n_bytes))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def run_logged(
    command: list[str],
    log_path: Path,
    timeout_s: float,
    grace_s: float = 0.0,
    env: dict[str, str] | None = None,
    stop: threading.Event | None = None,
) -> tuple[int, bool]:
    """Run command in its own session with its output in log_path; (return code, timed out). Never leaves it
    running: on timeout, Ctrl-C or once `stop` is set (how another thread ends it: lab.lanes) the whole process group
    is killed (after `grace_s`, see _kill_group). `env`: variables set for it on top of the worker environment."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    timed_out = False
    with log_path.open("w") as log:
        log.write("$ " + " ".join(shlex.quote(part) for part in command) + "\n")
        log.flush()
        proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env={**_worker_env(), **(env or {})}, start_new_session=True
        )
        try:
            _wait(proc, timeout_s, stop)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:  # also on Ctrl-C: the worker is in its own session, so the terminal's SIGINT never reaches it
            _kill_group(proc, grace_s)
            proc.wait()
    return proc.returncode, timed_out


def _wait(proc: subprocess.Popen, timeout_s: float, stop: threading.Event | None) -> None:
    """proc.wait(timeout_s) that also returns once `stop` is set."""
    if stop is None:
        proc.wait(timeout=timeout_s)
        return
    deadline = time.monotonic() + timeout_s
    while not stop.is_set():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise subprocess.TimeoutExpired(proc.args, timeout_s)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=min(remaining, 0.2))
            return


def cold_cache_env(cache_dir: Path) -> dict[str, str]:
    """Compile caches in `cache_dir`, a new empty folder: inductor's and Triton's (both otherwise persist across
    processes, so a run after the first compiles from the cache, faster than a user's first run), and the temporary
    folder, made here, under which inductor keeps the C++ headers its C++ wrapper precompiles, once per machine
    (codecache's precompiled_headers, outside TORCHINDUCTOR_CACHE_DIR)."""
    temporary = cache_dir / "tmp"
    temporary.mkdir(parents=True, exist_ok=True)  # a TMPDIR that does not exist is ignored
    return {
        "TORCHINDUCTOR_CACHE_DIR": str(cache_dir / "inductor"),
        "TRITON_CACHE_DIR": str(cache_dir / "triton"),
        "TMPDIR": str(temporary),
    }


def run_isolated(
    planned: Planned, work_dir: Path, log_path: Path, timeout_s: float, cold: bool = False
) -> dict[str, Any]:
    """Run one configuration in a fresh worker process (under torchrun: one per rank; rank 0 writes the record), its
    output going to log_path; return its record (never raises for a failed run). `cold`: with empty compile caches,
    deleted afterwards. A stop signal (KeyboardInterrupt) is raised on, carrying the record as `finished_run` where
    the worker had written it (it was exiting)."""
    out_path = work_dir / f"result-{time.monotonic_ns()}.json"
    started = time.perf_counter()
    p = planned.point
    grace_s = TORCHRUN_GRACE_S if p.world_size > 1 else 0.0
    stopped: KeyboardInterrupt | None = None
    with tempfile.TemporaryDirectory(dir=work_dir, prefix="caches-") if cold else contextlib.nullcontext() as caches:
        env = cold_cache_env(Path(caches)) if cold else None
        try:
            returncode, timed_out = run_logged(launch_command(planned, out_path), log_path, timeout_s, grace_s, env)
        except KeyboardInterrupt as stop:
            if not out_path.exists():
                raise
            stopped, returncode, timed_out = stop, 0, False
    wall_s = time.perf_counter() - started

    base = run_record(planned.config, status="error", world_size=p.world_size, parallel=p.parallel)
    base.update(step_time_ms=None, label=p.label)
    if out_path.exists():  # the worker finished its record (even if it then hung on exit)
        record = {**base, **json.loads(out_path.read_text())}
        out_path.unlink()
    else:
        status, message = classify_failure(_tail(log_path), returncode, timed_out=timed_out, timeout_s=timeout_s)
        record = {**base, "status": status, "error": message}
    record["wall_s"] = wall_s
    record["cold"] = cold
    if stopped is not None:
        stopped.finished_run = record
        raise stopped
    return record


def skipped_run(planned: Planned) -> dict[str, Any]:
    """The record of a configuration the plan found this machine cannot run (Planned.skip), as a worker that
    refused it would write it, without starting one."""
    p = planned.point
    parallel = p.parallel if p.world_size > 1 else "none"
    extra = planned.spec["extra"]
    return run_record(
        planned.config, status="skipped", reason=planned.skip, world_size=p.world_size, parallel=parallel, wall_s=0.0,
        **extra,
    )  # fmt: skip


def prepare_all_data(plan: Sequence[Planned], log: Callable[[str], None]) -> None:
    """Tokenise and cache each distinct (data, vocabulary) once, here, so that the workers only read the cache
    and never race to build it."""
    seen = set()
    for planned in plan:
        key = (planned.config.data, planned.config.model.vocab_size)
        if key not in seen:
            seen.add(key)
            started = time.perf_counter()
            data = prepare_data(*key)
            log(f"data: {data.description} (vocab {key[1]}; ready in {time.perf_counter() - started:.1f} s)")


def _progress_line(i: int, n: int, record: dict[str, Any]) -> str:
    head = f"[{i}/{n}] {record.get('label')}: "
    if record.get("status") != "ok":
        return head + _status_cell(record, width=160) + f" ({record['wall_s']:.0f} s)"
    speedup, scaling = record.get("speedup_vs_bf16"), record.get("scaling_vs_1gpu")
    return head + (
        f"ok {record['step_time_ms']:.1f} ms/step, {format_or_na(record.get('tokens_per_sec'), ',.0f')} tokens/s, "
        f"MFU {_pct(record.get('mfu'))}, peak {format_or_na(record.get('peak_mem_gib'), '.2f', ' GiB')}, "
        f"compile {format_or_na(record.get('compile_s'), '.1f', ' s')}"
        + (f", {speedup:.3f}x vs BF16+compile" if speedup is not None else "")
        + (f", {scaling:.3f}x vs 1 GPU" if scaling is not None else "")
        + f" ({record['wall_s']:.0f} s)"
    )


def _run_summary(record: dict[str, Any]) -> str:
    if record.get("status") != "ok":
        return _status_cell(record, width=160)
    tok_s = format_or_na(record.get("tokens_per_sec"), ",.0f")
    return f"{tok_s} tokens/s, compile {format_or_na(record.get('compile_s'), '.1f', ' s')}"


def _log_name(label: str) -> str:
    # Letters, digits, dots and dashes only: other characters (a "+lm_head" variant's "+") trip tools that copy results.
    return re.sub(r"[^A-Za-z0-9.-]+", "_", label) + ".log"


def run_sweep(plan: Sequence[Planned], options: SweepOptions, out_dir: Path, log=print) -> list[dict[str, Any]]:
    """Run every planned configuration in its own process, appending each record to out_dir/sweep.json as it
    arrives. With --repeats the configurations take turns, one run each per round (A, B, A, B, ...), so that whatever
    drifts on the machine over the sweep (its clocks, its other tenants) falls on every configuration alike; a
    configuration's record arrives with its last run. Returns this invocation's records."""
    json_path = out_dir / "sweep.json"
    previous = json.loads(json_path.read_text())["runs"] if json_path.exists() else []
    if previous:
        log(
            f"appending to {json_path} ({len(previous)} runs already there; a configuration run again replaces "
            "its earlier row in the table)"
        )
    records: list[dict[str, Any]] = []
    runs: list[list[dict[str, Any]]] = [[] for _ in plan]
    recorded: set[int] = set()
    repeats = options.repeats

    def record_configuration(i: int) -> None:
        recorded.add(i)
        record = combine_repeats(runs[i - 1])
        if len(runs[i - 1]) < repeats:  # cut short: the runs that finished, and how many were planned
            record["repeats_planned"] = repeats
        latest = latest_runs([*previous, *records, record])
        record["speedup_vs_bf16"] = speedup_for(record, latest)
        record["scaling_vs_1gpu"] = scaling_for(record, latest)
        records.append(record)
        append_runs(json_path, [record])
        write_outputs(out_dir, plot=False)
        log(_progress_line(i, len(plan), record))

    with tempfile.TemporaryDirectory(prefix="cs336-sweep-") as work:
        try:
            for k in range(1, repeats + 1):
                for i, planned in enumerate(plan, 1):
                    which = f" (run {k} of {repeats})" if repeats > 1 else ""
                    log_name = f"logs/{_log_name(planned.point.label + (f'.{k}' if repeats > 1 else ''))}"
                    if planned.skip is not None:
                        run = skipped_run(planned)
                    else:
                        log(f"[{i}/{len(plan)}] {planned.point.label}: running{which} ...")
                        try:
                            run = run_isolated(planned, Path(work), out_dir / log_name, options.timeout_s, options.cold)
                        except KeyboardInterrupt as stop:
                            if hasattr(stop, "finished_run"):  # the run had finished: kept like the others
                                runs[i - 1].append({**stop.finished_run, "log": log_name})
                            raise
                        run["log"] = log_name  # relative to the results folder, which may be moved or committed
                    runs[i - 1].append(run)
                    if repeats > 1:
                        log(f"  run {k}/{repeats}: {_run_summary(run)}")
                    if k == repeats:
                        record_configuration(i)
        except KeyboardInterrupt:
            # Nothing lost: a configuration whose repeats were cut short keeps the runs that finished.
            for i in range(1, len(plan) + 1):
                if runs[i - 1] and i not in recorded:
                    record_configuration(i)
            raise
    return records


def run_amdahl(planned: Planned, out_dir: Path, timeout_s: float) -> dict[str, Any]:
    """cs336_basics.diagnostics.amdahl in its own process for one configuration; its row, or a status record."""
    p = planned.point
    name = f"amdahl-{p.preset}-bs{p.batch_size}-{p.attention}-ac-{on_off(p.ac)}"
    config_path = out_dir / "logs" / f"{name}.config.json"
    config_path.parent.mkdir(parents=True, exist_ok=True)
    config_path.write_text(json.dumps(merge_layers(planned.from_file, planned.overrides), indent=2))
    json_path = out_dir / f"{name}.json"
    command = [sys.executable, "-m", "cs336_basics.diagnostics.amdahl", "--config", str(config_path)]
    returncode, timed_out = run_logged(
        [*command, "--json", str(json_path)], out_dir / "logs" / f"{name}.log", timeout_s
    )
    if json_path.exists() and not timed_out and returncode == 0:
        return {**json.loads(json_path.read_text())["runs"][0], "status": "ok"}
    tail = last_line(_tail(out_dir / "logs" / f"{name}.log"))
    status = "skipped" if returncode == 2 else "error"  # 2: a ConfigError, e.g. no CUDA GPU here
    return {
        "preset": p.preset,
        "batch_size": p.batch_size,
        "status": status,
        "error": f"timeout after {timeout_s:g} s" if timed_out else tail,
    }
