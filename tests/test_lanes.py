"""lab.lanes: jobs on GPUs of their own, as many at once as fit, a job marked alone with nothing beside it. Stand-in
jobs (shell commands that record CUDA_VISIBLE_DEVICES and sleep), so this runs on the CPU."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from cs336_basics.errors import ConfigError
from lab.lanes import main, parse_jobs, run_lanes

RECORD = 'echo "$CUDA_VISIBLE_DEVICES" > "$JOB_OUT/gpus"; sleep 0.4'


def _overlap(a, b) -> bool:
    return a.started_s < b.ended_s and b.started_s < a.ended_s


def _run(text: str, gpus: int, tmp_path):
    return run_lanes(parse_jobs(text, gpus), gpus, tmp_path, timeout_s=30, log=lambda line: None, poll_s=0.01)


def test_jobs_overlap_on_gpus_of_their_own_in_file_order(tmp_path):
    jobs = _run(f"# four GPUs\na 1 {RECORD}\nb 2 {RECORD}\nc 1 {RECORD}\nd 4 {RECORD}\ne 1 exit 3\n", 4, tmp_path)
    a, b, c, d, e = jobs
    assert _overlap(a, b) and _overlap(a, c) and _overlap(b, c)  # 1 + 2 + 1 GPUs fit on four at once
    assert d.started_s >= max(a.ended_s, b.ended_s, c.ended_s)  # d needs all four; e, which would fit, waits behind it
    assert e.started_s >= d.started_s
    for job in jobs:
        assert len(job.assigned) == job.gpus
        if job is not e:
            assert (tmp_path / job.name / "gpus").read_text().split()[0] == ",".join(map(str, job.assigned))
        for other in jobs:
            if other is not job and _overlap(job, other):
                assert not set(job.assigned) & set(other.assigned), (job.name, other.name)
    assert [job.returncode for job in jobs] == [0, 0, 0, 0, 3]
    recorded = json.loads((tmp_path / "lanes.json").read_text())
    assert [job["name"] for job in recorded["jobs"]] == ["a", "b", "c", "d", "e"]


def test_a_job_marked_alone_waits_for_the_host_to_be_free_and_keeps_it(tmp_path):
    before, alone, after = _run(f"before 1 {RECORD}\nalone 1! {RECORD}\nafter 1 {RECORD}\n", 4, tmp_path)
    assert alone.started_s >= before.ended_s  # GPUs were free: it waited for the host
    assert after.started_s >= alone.ended_s


def test_a_job_past_its_limit_is_stopped_and_the_run_exits_1(tmp_path, capsys):
    jobs_file = tmp_path / "jobs.txt"
    jobs_file.write_text("quick 1 true\nslow 1 sleep 30\n")
    assert main([str(jobs_file), "--gpus", "2", "--out", str(tmp_path / "out"), "--timeout_s", "0.5"]) == 1
    recorded = {job["name"]: job for job in json.loads((tmp_path / "out" / "lanes.json").read_text())["jobs"]}
    assert recorded["quick"]["returncode"] == 0 and not recorded["quick"]["timed_out"]
    assert recorded["slow"]["timed_out"] and recorded["slow"]["ended_s"] < 10
    assert "slow" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a 1", "expected 'NAME GPUS COMMAND'"),
        ("a two echo", "expected 'NAME GPUS COMMAND'"),
        ("a/b 1 echo", "expected 'NAME GPUS COMMAND'"),
        ("a 1 echo\na 1 echo", "the name 'a' is taken"),
        ("a 3 echo", "a needs 3 GPUs; this host has 2"),
        ("# only a comment\n\n", "holds no job"),
    ],
)
def test_a_malformed_jobs_file_is_one_error_naming_its_line(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_jobs(text, 2)


def test_an_unreadable_jobs_file_is_one_line_and_exit_1(tmp_path, capsys):
    assert main([str(tmp_path / "missing.txt"), "--gpus", "1", "--out", str(tmp_path)]) == 1
    assert "missing.txt" in capsys.readouterr().err


def test_more_gpus_than_the_host_has_are_refused_before_any_job_starts(tmp_path, monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    jobs_file = tmp_path / "jobs.txt"
    jobs_file.write_text(f"a 1 {RECORD}\n")
    assert main([str(jobs_file), "--gpus", "4", "--out", str(tmp_path / "out")]) == 2
    assert "--gpus 4, but this host has 2 CUDA GPUs" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_sigterms_to_the_lanes_stop_each_running_job_and_let_it_clean_up_first(tmp_path):
    # `timeout` signals the lanes, not the jobs (each in a session of its own): the lanes must pass the stop on, or a
    # job keeps its GPUs busy under the next command. The job traps the SIGTERM to prove it had its time to clean up.
    job = "trap 'echo done > $JOB_OUT/cleaned; exit 0' TERM; echo $$ > $JOB_OUT/pid; sleep 60 & wait"
    jobs_file = tmp_path / "jobs.txt"
    jobs_file.write_text(f"long 1 {job}\nnever 1 true\n")
    lanes = subprocess.Popen([sys.executable, "-m", "lab.lanes", str(jobs_file), "--gpus", "1", "--out",
                              str(tmp_path / "out")], stderr=subprocess.PIPE, text=True)  # fmt: skip
    pid_file = tmp_path / "out" / "long" / "pid"
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text().strip()):
        assert time.monotonic() < deadline and lanes.poll() is None, "the job never started"
        time.sleep(0.05)
    job_pid = int(pid_file.read_text())
    lanes.send_signal(signal.SIGTERM)  # twice, as `timeout` sends it (to the lanes, then to their process group)
    time.sleep(0.05)
    lanes.send_signal(signal.SIGTERM)
    assert lanes.wait(timeout=30) == 128 + signal.SIGTERM
    assert "stopped" in lanes.stderr.read()
    assert not _alive(job_pid)
    assert (tmp_path / "out" / "long" / "cleaned").read_text() == "done\n"
    recorded = {job["name"]: job for job in json.loads((tmp_path / "out" / "lanes.json").read_text())["jobs"]}
    assert recorded["long"]["stopped"] and recorded["never"]["started_s"] is None


TESTS = Path(__file__).resolve().parent
# A GPU test is marked on its own line (a decorator) or for its whole file.
GPU_MARK = re.compile(r"^(@pytest\.mark\.gpu|pytestmark = pytest\.mark\.gpu)$", re.MULTILINE)


def test_the_gpu_tier_jobs_run_every_file_with_gpu_tests_once():
    """tests/gpu-tier-*.jobs split the GPU tier over one 4-GPU host's GPUs; a file of GPU tests they leave out would
    never run there. Each file is named once, but test_distributed.py: its 4-GPU chain in a job of 4 GPUs, the rest
    in a job of 2, by complementary -k expressions."""
    with_gpu_tests = {path.name for path in TESTS.glob("test_*.py") if GPU_MARK.search(path.read_text())}
    jobs = [job for part in (1, 2) for job in parse_jobs((TESTS / f"gpu-tier-{part}.jobs").read_text(), gpus=4)]
    named = Counter(name for job in jobs for name in re.findall(r"\btests/(test_\w+\.py)\b", job.command))
    assert set(named) == with_gpu_tests
    assert {name for name, count in named.items() if count > 1} == {"test_distributed.py"}
    assert all(" -m gpu " in job.command for job in jobs)
    distributed = sorted((job.gpus, job.command.split(" -k ")[1]) for job in jobs if "test_distributed" in job.command)
    assert distributed == [(2, '"not four"'), (4, "four")]
