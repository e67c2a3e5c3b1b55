"""lab.cpu_speed: each probing process runs bound to its CPU, stops on time or when interrupted and still writes its
samples, and the summary tells a CPU's slow samples from its fast ones."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab.cpu_speed import parse_cpus, per_second, probe, summary

ROOT = Path(__file__).resolve().parent.parent
linux_only = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs Linux's CPU affinity")


def test_cpus_are_read_as_one_a_range_or_a_list():
    assert parse_cpus("15") == [15]
    assert parse_cpus("0-3") == [0, 1, 2, 3]
    assert parse_cpus("0,8-9") == [0, 8, 9]


def test_the_summary_counts_samples_over_one_and_a_half_times_the_fastest_tenth_as_slow():
    samples = [(100.0 + i / 10, 0.6) for i in range(70)] + [(107.0 + i / 10, 1.2) for i in range(30)]
    row = summary(dict(cpu=3, samples=samples))
    assert row == dict(cpu=3, n=100, median_ms=0.6, p10_ms=0.6, slow_share=0.3)
    bins = per_second(samples)
    assert [b["second"] for b in bins] == list(range(10))
    assert [b["median_ms"] for b in bins] == [0.6] * 7 + [1.2] * 3 and {b["n"] for b in bins} == {10}


@linux_only
def test_each_probing_process_runs_on_its_own_cpu_only_and_this_one_keeps_its_cpus():
    allowed = sorted(os.sched_getaffinity(0))
    cpus = allowed[-2:]
    runs = probe(cpus, seconds=0.3)
    assert [run["cpu"] for run in runs] == cpus
    assert [run["affinity"] for run in runs] == [[cpu] for cpu in cpus]
    assert all(len(run["samples"]) > 10 for run in runs)
    assert sorted(os.sched_getaffinity(0)) == allowed


@linux_only
def test_a_probe_without_an_end_stops_on_sigterm_and_writes_its_record(tmp_path):
    out = tmp_path / "speed.json"
    cpu = max(os.sched_getaffinity(0))
    command = [sys.executable, "-m", "lab.cpu_speed", "probe", "--cpus", str(cpu), "--seconds", "0", "--json", str(out)]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    time.sleep(3)  # past start-up: a signal before probe() blocks it would end the process unwritten
    process.send_signal(signal.SIGTERM)
    printed, _ = process.communicate(timeout=30)
    assert process.returncode == 0
    record = json.loads(out.read_text())
    assert record["summary"][0]["cpu"] == cpu and record["summary"][0]["n"] > 10
    assert json.loads(printed.splitlines()[0]) == record["summary"][0]
    assert record["per_second"][0]["bins"] and len(record["runs"][0]["samples"]) == record["summary"][0]["n"]


def test_a_cpu_slow_throughout_is_counted_slow_against_the_fastest_cpu():
    slow_cpu = dict(cpu=1, samples=[(100.0 + i / 10, 1.2) for i in range(50)])
    assert summary(slow_cpu)["slow_share"] == 0.0  # against its own fastest tenth it looks steady
    assert summary(slow_cpu, fast_ms=0.6)["slow_share"] == 1.0
    assert summary(dict(cpu=2, samples=[]))["n"] == 0  # a worker stopped before its first sample
