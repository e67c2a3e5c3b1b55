"""lab.thread_binding: each local rank's CPU, the binding of the loop's and autograd's threads when autograd's thread
starts, the start-up hook that does it only in training processes, and the probe's record. Every binding happens
in a child process: binding pytest's own threads would slow the rest of the tier."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lab.thread_binding import rank_cpu
from lab.thread_binding_site.sitecustomize import program

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "lab" / "thread_binding_site"
linux_only = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux's /proc and affinity")


def test_each_local_rank_gets_the_first_cpu_of_its_own_share():
    assert [rank_cpu(set(range(32)), rank, 2) for rank in range(2)] == [0, 16]
    assert [rank_cpu(set(range(64)), rank, 4) for rank in range(4)] == [0, 16, 32, 48]
    assert rank_cpu({3, 5, 7, 9}, 1, 2) == 7
    assert rank_cpu(set(range(16)), 0, 1) == 0
    with pytest.raises(ValueError, match="local rank 2"):
        rank_cpu(set(range(8)), 2, 2)


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)  # fmt: skip


@linux_only
def test_the_loop_and_autograds_thread_are_bound_to_one_cpu_when_autograds_thread_starts():
    cpu = max(os.sched_getaffinity(0))
    done = _run(f"""
        import ctypes, os, threading
        from lab.thread_binding import bind_when_autograd_starts
        watcher = bind_when_autograd_starts(poll_s=0.01, cpu={cpu})
        other = threading.Thread(target=threading.Event().wait, args=(30,), daemon=True)
        other.start()  # a thread that is not autograd's: it keeps every CPU
        tids = []
        def autograd_like():
            tids.append(threading.get_native_id())  # before the name, which the watcher waits for
            ctypes.CDLL(None).prctl(15, b"pt_autograd_0", 0, 0, 0)  # PR_SET_NAME: how the kernel names it
            threading.Event().wait(30)
        threading.Thread(target=autograd_like, daemon=True).start()
        watcher.join(10)
        print(sorted(os.sched_getaffinity(0)), sorted(os.sched_getaffinity(tids[0])),
              len(os.sched_getaffinity(other.native_id)))
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("]")[:2] == [f"[{cpu}", f" [{cpu}"]
    assert int(done.stdout.rsplit("]", 1)[1]) == len(os.sched_getaffinity(0))
    assert f"pt_autograd_0 bound to CPU {cpu}" in done.stderr


def test_the_start_up_hook_knows_a_rank_from_torchruns_launcher():
    launcher = ["python3", "-m", "torch.distributed.run", "--nproc_per_node=2", "-m", "cs336_basics.sweep.worker"]
    assert program(launcher) == "torch.distributed.run"
    assert program(["python3", "-u", "-m", "cs336_basics.sweep.worker", "--spec", "{}"]) == "cs336_basics.sweep.worker"
    assert program(["python3", "-X", "dev", "train_h100.py", "--use_fp8"]) == "train_h100.py"
    assert program(["/usr/bin/python3", "/usr/local/bin/torchrun", "train_h100.py"]) == "/usr/local/bin/torchrun"
    assert program(["python3", "-c", "print('train_h100.py')"]) == ""


@linux_only
def test_the_start_up_hook_watches_in_training_processes_only(tmp_path):
    show = "import threading; print(sorted(t.name for t in threading.enumerate()))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SITE), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    other = subprocess.run([sys.executable, "-c", show], capture_output=True, text=True, env=env, timeout=60)
    script = tmp_path / "train_h100.py"
    script.write_text(show)
    training = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=60)
    assert other.returncode == training.returncode == 0, other.stderr + training.stderr
    assert "lab-thread-bind" not in other.stdout
    assert "lab-thread-bind" in training.stdout


@linux_only
def test_the_probe_records_each_interval_and_a_summary(tmp_path):
    out = tmp_path / "probe.json"
    done = subprocess.run(
        [sys.executable, "-m", "lab.thread_binding", "probe", "--device", "cpu", "--cpus", "late", "--seconds", "0.2",
         "--steps_per_interval", "2", "--warmup_steps", "1", "--json", str(out)],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    record = json.loads(out.read_text())
    assert record["cpus"] == "late" and record["intervals"]
    assert set(record["intervals"][0]) == {"step_ms", "cpu_ms_per_step", "python_loop_ms"}
    assert record["summary"]["intervals"] == len(record["intervals"])
    assert record["summary"]["step_ms_min"] <= record["summary"]["step_ms"] <= record["summary"]["step_ms_max"]
