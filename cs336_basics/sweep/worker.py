"""Run ONE sweep configuration in this process and write its result record as JSON.

    python -m cs336_basics.sweep.worker --spec '{"overrides": {...}}' --out result.json
    python -m cs336_basics.sweep.worker --spec @spec.json --out result.json

The spec is {"overrides": <config.build_config overrides, preset included>, "from_file": <optional config-file
layer>, "extra": <fields copied into the record>}. The run takes the same path as train_h100.py
(`run.run_training`: resolve -> data -> model -> device/dtype -> FP8 conversion -> Trainer compiles), in a
temporary run folder, with its log going to this process's stdout (the sweep sends it to a log file).

The record is results.run_record / result_record plus `status`:
  ok       trained; tokens/s, MFU, step time, peak memory, compile time, loss measured
  skipped  this machine cannot run the configuration (FP8 without an sm_89+ GPU, flash attention unavailable,
           a CUDA device that is not there): the build stage's NotSupportedHere, raised before any work;
           `reason` holds its message
  oom      torch.OutOfMemoryError; `error` holds the message
  error    anything else (a bad configuration such as a context longer than the data, a crash); `error` holds
           the exception type and the last line of its message
The worker exits 0 whenever it wrote a record (under torchrun, see below, only if the run succeeded); the sweep reads
the record, or classifies the exit if none came.

Under torchrun (a world size above 1) every rank runs this, all in one run folder (the program checks that its ranks
share it): `<--out>.run`, beside the record, which rank 0 removes after the run. Rank 0 alone writes the record:
world_size, parallel, tokens/s of all ranks together (the global batch per step time) and peak_mem_gib, the largest
of the ranks' peaks.
A rank whose run failed exits 1, so that torchrun stops the other ranks at once instead of leaving them waiting in a
collective; if that rank is not rank 0, no record is written and the sweep classifies torchrun's log, which holds
every rank's output.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import signal
import tempfile
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from cs336_basics.config_layers import build_config
from cs336_basics.errors import ConfigError, NotSupportedHere, rank_prefix, report_error
from cs336_basics.files.atomic import write_json_atomic
from cs336_basics.measure.results import run_record
from cs336_basics.parallel.world import SINGLE, World, exit_process, torchrun_world
from cs336_basics.run import run_training

# Text that marks an out-of-memory failure when only the text is left (a worker that died without a record, or
# an OOM that a compiler wrapped in its own exception type).
OOM_MARKERS = ("outofmemoryerror", "cuda out of memory", "out of memory")
MAX_MESSAGE = 400


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


def last_line(text: str) -> str:
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines[-1] if lines else ""


def classify_failure(
    text: str, returncode: int | None = None, *, timed_out: bool = False, timeout_s: float | None = None
) -> tuple[str, str]:
    """(status, message) for a failed configuration, from what is left of it: its output text (an exception's
    text, or the tail of a worker's log) and the worker's exit code (negative: killed by that signal)."""
    if timed_out:
        limit = f" after {timeout_s:g} s" if timeout_s is not None else ""
        return "error", f"timeout{limit} (the worker was killed)"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    oom = next((line for line in reversed(lines) if any(m in line.lower() for m in OOM_MARKERS)), None)
    if oom is not None:
        return "oom", _clip(oom)
    last = lines[-1] if lines else ""
    if returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        hint = " (the host's OOM killer?)" if -returncode == signal.SIGKILL else ""
        return "error", _clip(f"killed by {name}{hint}" + (f"; last output: {last}" if last else ""))
    if not last:
        return "error", f"no result and no output (exit code {returncode})"
    return "error", _clip(last)


def classify_exception(exc: BaseException) -> tuple[str, str]:
    """(status, message) for an exception raised by a run: "oom" for torch.OutOfMemoryError anywhere in its
    cause/context chain (compilers wrap it), else what classify_failure makes of its type and last line."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    for err in seen:
        if isinstance(err, torch.OutOfMemoryError):
            return "oom", _clip(f"{type(err).__name__}: {last_line(str(err))}")
    return classify_failure(f"{type(exc).__name__}: {last_line(str(exc))}")


def _log(message: str) -> None:
    print(message, flush=True)


@contextlib.contextmanager
def _run_folder(shared: Path | None, world: World) -> Iterator[Path]:
    """The run folder: a temporary one of this process's, or `shared`, the folder of every rank (one process, or all
    of a torchrun launch), which rank 0 removes when its run has ended."""
    if shared is None:
        with tempfile.TemporaryDirectory(prefix="cs336-sweep-") as tmp:
            yield Path(tmp)
        return
    try:
        yield shared
    finally:
        if world.is_main:  # a finished run's ranks are done with it: its process group ended with all of them
            shutil.rmtree(shared, ignore_errors=True)


def run_one(spec: dict[str, Any], log=_log, shared_folder: Path | None = None) -> dict[str, Any]:
    """Build the config from the spec, train it if this machine can, and return its record (never raises for a
    failed run: the failure is the record). Under torchrun, on ranks but 0, a run that succeeded returns only its
    status (rank 0 has the measurements). `shared_folder`: the run folder (of every rank under torchrun); without
    it, a temporary one."""
    extra = {"step_time_ms": None, **(spec.get("extra") or {})}
    try:
        config = build_config(spec["overrides"], spec.get("from_file"))
        world = torchrun_world() or SINGLE
    except ConfigError as exc:  # the sweep validates every config before it starts, so this is a caller bug
        return {**extra, "status": "error", "error": _clip(f"ConfigError: {exc}")}
    # A run that did not finish resolved no mode: its record names the world it was launched on and the mode asked.
    unfinished = {"world_size": world.world_size, "parallel": config.train.parallel if world.world_size > 1 else "none"}

    started = time.perf_counter()
    try:
        with _run_folder(shared_folder, world) as folder:
            run_training(config.replace(train={"out_dir": str(folder)}), log=log)
            if not world.is_main:
                return {"status": "ok"}
            # run_training writes the standard result record (results.result_record) there; reuse it as is.
            record = json.loads((folder / "result.json").read_text())
    except NotSupportedHere as exc:  # raised by the build stage before any work: this machine cannot run it
        log(f"skipped: {exc}")
        return run_record(config, status="skipped", reason=_clip(str(exc)), **unfinished, **extra)
    except Exception as exc:  # noqa: BLE001 - any failure is this configuration's result, not the sweep's
        traceback.print_exc()
        status, message = classify_exception(exc)
        elapsed = time.perf_counter() - started
        return run_record(config, status=status, error=message, train_s=elapsed, **unfinished, **extra)

    record.update(extra)
    record["status"] = "ok"
    record["train_s"] = time.perf_counter() - started
    if record.get("tokens_per_sec"):
        # The Trainer's tokens/s is the global batch's tokens per step / median step time (all ranks together), so
        # this is that median step time.
        tokens_per_step = record["batch_size"] * record["seq_len"] * record["gradient_accumulation_steps"]
        record["step_time_ms"] = 1e3 * tokens_per_step * record["world_size"] / record["tokens_per_sec"]
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", required=True, help="the configuration as JSON, or @FILE holding it")
    parser.add_argument("--out", required=True, help="where to write the result record (JSON)")
    args = parser.parse_args(argv)
    spec = json.loads(Path(args.spec[1:]).read_text() if args.spec.startswith("@") else args.spec)
    try:
        world = torchrun_world() or SINGLE
    except ConfigError as exc:  # torchrun's variables set in part: which rank writes the record is unknown
        return report_error(exc)
    # The run folder beside the record, in the sweep's temporary folder: removed with it even where the sweep kills
    # this process before it can clean up (at once, in one process: run.run_isolated).
    record = run_one(spec, shared_folder=Path(args.out).with_suffix(".run"))
    if world.is_main:
        write_json_atomic(args.out, record)
    detail = record.get("error") or record.get("reason") or ""
    print(f"{rank_prefix()}worker: status {record['status']}" + (f": {detail}" if detail else ""), flush=True)
    return 1 if world.launched and record["status"] in ("oom", "error") else 0


if __name__ == "__main__":
    exit_process(main())
