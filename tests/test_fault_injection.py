"""Fault injection: a training process is killed at random points, with SIGKILL, SIGTERM or SIGINT, including in the
middle of a checkpoint write; it is then resumed (as often as needed) until it finishes. Every time, the metrics
(loss, gradient norm, learning rate at every step) and the final weights and optimizer state must equal those of an
uninterrupted run bit for bit, every checkpoint left on disk must load, and no temporary file may remain."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tiny import TINY_FLAGS

from cs336_basics.files.atomic import TEMP_PREFIX
from cs336_basics.training.checkpoint import CHECKPOINT_NAME, read_checkpoint
from cs336_basics.training.metrics import read_metrics

DRIVER = Path(__file__).resolve().parent / "fault_driver.py"
STEPS = 40
TRIALS = 9  # each signal at random points and in the middle of a write (trial % 3, trial % 2)
SIGNALS = (signal.SIGKILL, signal.SIGTERM, signal.SIGINT)
EXIT_CODES = {signal.SIGKILL: -signal.SIGKILL, signal.SIGTERM: 143, signal.SIGINT: 130}


def launch(argv: list[str], out: Path) -> subprocess.Popen:
    # One thread: the same arithmetic in every process, so bit-for-bit comparisons are meaningful.
    env = {**os.environ, "TQDM_DISABLE": "1", "OMP_NUM_THREADS": "1", "FAULT_MARKERS": str(out) + ".markers"}
    return subprocess.Popen(
        [sys.executable, str(DRIVER), *argv], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


def lines(path: Path) -> int:
    try:
        return len(path.read_text().splitlines())
    except FileNotFoundError:
        return 0


def wait_for(condition, proc: subprocess.Popen, timeout_s: float = 120.0) -> bool:
    """True once `condition()` holds; False if the process ended first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.002)
    raise TimeoutError("the training process neither reached the kill point nor finished")


def run_to_completion(argv: list[str], out: Path) -> None:
    for _ in range(5):
        resume = ["--resume"] if (out / CHECKPOINT_NAME).exists() else ["--overwrite"]
        proc = launch([*argv, *resume], out)
        _, err = proc.communicate(timeout=300)
        if proc.returncode == 0:
            return
        raise AssertionError(f"the resumed run failed ({proc.returncode}): {err}")


def final_state(out: Path) -> tuple[list, dict[str, torch.Tensor]]:
    metrics = [(r["step"], r["loss"], r["grad_norm"], r["lr"]) for r in read_metrics(out / "metrics.jsonl")]
    ckpt = read_checkpoint(out / CHECKPOINT_NAME)
    tensors = {f"model.{k}": v for k, v in ckpt["model"].items()}
    tensors |= {f"master.{k}": v for k, v in ckpt["optimizer"]["master"].items()}
    tensors |= {f"{k}.{n}": t for k, s in ckpt["optimizer"]["state"].items() for n, t in s.items()}
    return metrics, tensors


@pytest.mark.slow
def test_kills_at_random_points_never_change_the_result(tmp_path, token_files):
    base = [*TINY_FLAGS, *token_files, "--log_every=1", "--eval_every=0", "--checkpoint_every=4"]
    base += [f"--max_steps={STEPS}"]

    reference = tmp_path / "reference"
    proc = launch([*base, f"--out_dir={reference}"], reference)
    assert proc.wait(timeout=300) == 0, proc.stderr.read()
    expected_metrics, expected_tensors = final_state(reference)
    assert len(expected_metrics) == STEPS

    rng = random.Random(0)
    outcomes = []
    for trial in range(TRIALS):
        out = tmp_path / f"trial{trial}"
        argv = [*base, f"--out_dir={out}"]
        signum = SIGNALS[trial % len(SIGNALS)]
        mid_save = trial % 2 == 1
        proc = launch(argv, out)
        markers = Path(str(out) + ".markers")
        if mid_save:  # the n-th checkpoint write, while half of it is on disk
            nth = rng.randint(1, STEPS // 4)
            reached = wait_for(lambda nth=nth, markers=markers: lines(markers) >= nth, proc)
        else:  # a random moment between two metrics lines (anywhere in a step)
            step = rng.randint(1, STEPS - 1)
            reached = wait_for(lambda step=step, out=out: lines(out / "metrics.jsonl") >= step, proc)
            time.sleep(rng.uniform(0, 0.02))
        if reached:
            proc.send_signal(signum)
        _, err = proc.communicate(timeout=300)
        outcomes.append((signum, mid_save, proc.returncode))
        if proc.returncode != 0:  # it was stopped (a run that finished first needs nothing more)
            assert proc.returncode == EXIT_CODES[signum], err
            if (out / CHECKPOINT_NAME).exists():
                read_checkpoint(out / CHECKPOINT_NAME)  # whatever was killed, the checkpoint on disk reads
            run_to_completion(argv, out)

        metrics, tensors = final_state(out)
        assert metrics == expected_metrics, f"trial {trial}: {signal.Signals(signum).name}, mid-save {mid_save}"
        assert tensors.keys() == expected_tensors.keys()
        assert all(torch.equal(tensors[k], expected_tensors[k]) for k in tensors), f"trial {trial}"
        assert not [p for p in out.rglob(f"{TEMP_PREFIX}*")], f"trial {trial}: temporary files left"

    stopped = [o for o in outcomes if o[2] != 0]
    assert len(stopped) >= TRIALS - 2, outcomes  # the kills landed (a run may rarely finish before its signal)
    assert {s for s, _, _ in stopped} == set(SIGNALS) and any(mid for _, mid, _ in stopped)
