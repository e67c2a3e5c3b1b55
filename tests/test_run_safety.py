"""Runs never lose or corrupt work: each case is one of the failures a careful tester found (issue: "Runs that never
lose or corrupt work"), driven through train_h100.main on the tiny CPU model."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny import TINY_FLAGS

import train_h100
from cs336_basics.files.atomic import TEMP_PREFIX, temp_prefix, write_json_atomic
from cs336_basics.training import checkpoint as checkpoint_module
from cs336_basics.training.checkpoint import CHECKPOINT_NAME
from cs336_basics.training.metrics import MetricsLog, read_metrics
from cs336_basics.training.restore import load_checkpoint
from cs336_basics.training.run_folder import RUN_FILES, RunFolder
from cs336_basics.training.signals import Interrupted, terminate_raises
from cs336_basics.training.trainer import Trainer

REPO = Path(__file__).resolve().parents[1]


def run(argv, capsys):
    code = train_h100.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error:")]


def checkpoint_is_finite(path: Path) -> bool:
    ckpt = torch.load(path, weights_only=True)
    tensors = list(ckpt["model"].values()) + list(ckpt["optimizer"]["master"].values())
    tensors += [t for s in ckpt["optimizer"]["state"].values() for k, t in s.items() if k != "step"]
    return all(torch.isfinite(t).all() for t in tensors)


@pytest.fixture
def base(token_files):
    return [*TINY_FLAGS, *token_files, "--eval_every", "0"]


# ---- 1. never a checkpoint from a non-finite state ----


def test_a_nan_gradient_never_reaches_a_checkpoint(tmp_path, base, capsys):
    out = tmp_path / "nan"
    argv = [*base, "--lr", "1e6", "--warmup_steps", "0", "--checkpoint_every", "1", "--max_steps", "8"]
    code, _, err = run([*argv, "--out_dir", out], capsys)
    assert code == 1 and "became NaN/inf" in err
    assert len(error_lines(err)) == 1
    bad_step = int(err.split("NaN/inf at step ")[1].split(".")[0])
    ckpt_path = out / CHECKPOINT_NAME
    if ckpt_path.exists():  # a checkpoint from before the bad step: finite, and the message names it
        ckpt = load_checkpoint(ckpt_path, restore_rng=False)
        assert ckpt["step"] < bad_step and checkpoint_is_finite(ckpt_path)
        assert f"checkpoint from step {ckpt['step']}" in err and "is intact" in err


def test_non_finite_weights_are_refused_at_save(tmp_path, base, capsys, monkeypatch):
    # Finite losses and gradient norms, yet the weights turn NaN (as a bad update could): no checkpoint is written.
    real_step = Trainer.train_step

    def poison_after_step_3(self):
        result = real_step(self)
        if self.step == 3:
            with torch.no_grad():
                self.optimizer.masters[0].fill_(float("nan"))
        return result

    monkeypatch.setattr(Trainer, "train_step", poison_after_step_3)
    out = tmp_path / "poison"
    code, _, err = run([*base, "--max_steps", "8", "--checkpoint_every", "2", "--out_dir", out], capsys)
    assert code == 1 and "weights or optimizer moments became NaN/inf" in err
    assert load_checkpoint(out / CHECKPOINT_NAME, restore_rng=False)["step"] == 2
    assert checkpoint_is_finite(out / CHECKPOINT_NAME)


# ---- 2. and 3. one run per folder; a finished run is never overwritten by accident ----


def test_a_second_run_in_a_locked_folder_is_refused(tmp_path, base, capsys):
    out = tmp_path / "busy"
    with RunFolder(out).locked():  # as if another process were training there
        code, stdout, err = run([*base, "--max_steps", "2", "--out_dir", out], capsys)
    assert code == 2 and f"in use by another run (PID {os.getpid()} on {socket.gethostname()})" in err
    assert "FINAL CONFIGURATION SUMMARY" not in stdout
    assert not (out / "config.json").exists()
    # A live run before its first checkpoint: --resume, a fresh start and --overwrite are each told it is in use, not
    # that it stopped early or holds an earlier run (whose fixes would be refused in turn).
    with RunFolder(out).locked():
        (out / "config.json").write_text("{}")
        for flags in (["--resume"], [], ["--overwrite"]):
            code, _, err = run([*base, *flags, "--max_steps", "2", "--out_dir", out], capsys)
            assert code == 2 and "in use by another run" in err and "--overwrite" not in err, (flags, err)


def test_a_refused_run_leaves_no_folder_and_checks_for_an_earlier_run_before_preparing_data(
    tmp_path, base, capsys, monkeypatch
):
    out = tmp_path / "new" / "run"
    code, _, err = run([*base, "--parallel", "ddp", "--out_dir", out], capsys)  # refused by the plan, under the lock
    assert code == 2 and "--parallel ddp needs several processes" in err
    assert not out.exists() and (tmp_path / "new").is_dir()  # its own folder gone; a parent it made stays
    out.mkdir()
    assert run([*base, "--parallel", "ddp", "--out_dir", out], capsys)[0] == 2
    assert out.is_dir() and list(out.iterdir()) == []  # the user's folder stays, without the refused run's lock
    (out / "config.json").write_text("{}")  # an earlier run: refused before any data is read or tokenized
    monkeypatch.setattr("cs336_basics.run.prepare_data", lambda *a: pytest.fail("data prepared before the check"))
    code, _, err = run([*base, "--max_steps", "2", "--out_dir", out], capsys)
    assert code == 2 and "already holds a run (config.json)" in err


@pytest.mark.slow
def test_two_processes_started_together_one_runs_one_is_refused(tmp_path, token_files):
    out = tmp_path / "race"
    argv = [
        *TINY_FLAGS,
        *token_files,
        "--eval_every",
        "0",
        "--log_every",
        "10",
        "--max_steps",
        "30",
        "--out_dir",
        str(out),
    ]
    cmd = [sys.executable, str(REPO / "train_h100.py"), *argv]
    env = {**os.environ, "TQDM_DISABLE": "1", "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in "ab"]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    assert any("in use by another run" in err for _, err in results)
    records = read_metrics(out / "metrics.jsonl")  # one run's metrics, every line valid JSON
    assert [r["step"] for r in records] == list(range(10, 31, 10))


def test_a_fresh_run_into_a_finished_runs_folder_is_refused(tmp_path, base, capsys):
    out = tmp_path / "done"
    assert run([*base, "--max_steps", "4", "--out_dir", out], capsys)[0] == 0
    before = {name: (out / name).read_bytes() for name in ("config.json", "metrics.jsonl", "result.json")}
    code, _, err = run([*base, "--max_steps", "6", "--lr", "1e-3", "--out_dir", out], capsys)
    assert code == 2 and "already holds a run" in err and "--overwrite" in err and "--resume" in err
    assert {name: (out / name).read_bytes() for name in before} == before
    # --overwrite starts afresh, deliberately.
    code, _, err = run([*base, "--max_steps", "6", "--overwrite", "--out_dir", out], capsys)
    assert code == 0, err
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")][-1] == 6
    assert json.loads((out / "config.json").read_text())["train"]["overwrite"] is False  # not a run setting


# ---- 4. SIGINT and SIGTERM: finish the step, save at its boundary, resume exactly ----


def test_outside_training_repeated_sigterms_are_one_request_that_raises_once():
    # `timeout` signals the process, then its process group: the second SIGTERM must not cut short the clean-up that
    # the first started (a sweep stopping its torchrun worker with a grace, the lanes stopping their jobs).
    previous = signal.getsignal(signal.SIGTERM)
    caught = []
    with terminate_raises():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        except Interrupted as first:
            caught.append(first.exit_code)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)  # a handler runs between bytecodes: this is where a second raise would land
    assert caught == [143]
    assert signal.getsignal(signal.SIGTERM) is previous


def signal_self_at_step(monkeypatch, at_step: int, signums: list[int]) -> None:
    """Make the training loop receive `signums` (one after another) during step `at_step`, as from outside."""
    real_step = Trainer.train_step

    def step_with_signals(self):
        result = real_step(self)
        if self.step == at_step:
            for signum in signums:
                os.kill(os.getpid(), signum)
        return result

    monkeypatch.setattr(Trainer, "train_step", step_with_signals)


@pytest.mark.parametrize("signum, exit_code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stop_signal_saves_at_the_step_boundary_and_resume_is_exact(
    tmp_path, base, capsys, monkeypatch, signum, exit_code
):
    common = [*base, "--log_every", "5", "--checkpoint_every", "100", "--max_steps", "15"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert run([*common, "--out_dir", straight], capsys)[0] == 0

    signal_self_at_step(monkeypatch, at_step=7, signums=[signum])  # inside the step: after the batch was drawn
    code, _, err = run([*common, "--out_dir", split], capsys)
    assert code == exit_code and f"stopped by {signal.Signals(signum).name} at step 8" in err
    assert f"Continue with: --resume --out_dir {split}" in err
    assert load_checkpoint(split / CHECKPOINT_NAME, restore_rng=False)["step"] == 8
    monkeypatch.undo()
    assert run(["--resume", "--out_dir", split], capsys)[0] == 0

    expected = read_metrics(straight / "metrics.jsonl")
    resumed = read_metrics(split / "metrics.jsonl")
    # The interval 6..10 straddles the stop: its mean loss is still over the same five steps, bit for bit.
    assert [(r["step"], r["loss"]) for r in resumed] == [(r["step"], r["loss"]) for r in expected]
    a = load_checkpoint(straight / CHECKPOINT_NAME, restore_rng=False)["model"]
    b = load_checkpoint(split / CHECKPOINT_NAME, restore_rng=False)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_second_signal_during_the_save_waits_for_the_save(tmp_path, base, capsys, monkeypatch):
    real_save = checkpoint_module.torch.save

    def save_interrupted_midway(obj, f):
        os.kill(os.getpid(), signal.SIGINT)  # the second signal arrives while the file is being written
        real_save(obj, f)

    signal_self_at_step(monkeypatch, at_step=3, signums=[signal.SIGTERM])
    monkeypatch.setattr(checkpoint_module.torch, "save", save_interrupted_midway)
    out = tmp_path / "twice"
    code, _, err = run([*base, "--checkpoint_every", "100", "--max_steps", "10", "--out_dir", out], capsys)
    assert code == 130 and "a checkpoint is being written" in err
    assert load_checkpoint(out / CHECKPOINT_NAME, restore_rng=False)["step"] == 4
    assert not [p for p in out.iterdir() if p.name.startswith(TEMP_PREFIX)]


def test_a_second_signal_outside_a_save_stops_at_once_without_saving(tmp_path, base, capsys, monkeypatch):
    signal_self_at_step(monkeypatch, at_step=5, signums=[signal.SIGINT, signal.SIGINT])
    out = tmp_path / "abort"
    code, _, err = run([*base, "--checkpoint_every", "2", "--max_steps", "10", "--out_dir", out], capsys)
    assert code == 130 and "second Ctrl-C" in err and "checkpoint from step 4" in err
    assert load_checkpoint(out / CHECKPOINT_NAME, restore_rng=False)["step"] == 4


def test_repeated_sigterms_are_one_stop_request(tmp_path, base, capsys, monkeypatch):
    # `timeout` and schedulers signal the process and its process group: one stop arrives twice.
    signal_self_at_step(monkeypatch, at_step=5, signums=[signal.SIGTERM, signal.SIGTERM])
    out = tmp_path / "twice"
    code, _, err = run([*base, "--checkpoint_every", "2", "--max_steps", "10", "--out_dir", out], capsys)
    assert code == 143 and f"stopped by SIGTERM at step 6; saved {out / CHECKPOINT_NAME}" in err
    assert err.count("is intact") == 0  # a clean stop says what it saved, once
    assert load_checkpoint(out / CHECKPOINT_NAME, restore_rng=False)["step"] == 6


def test_a_stop_signal_in_a_run_without_checkpoints_promises_none(tmp_path, base, capsys, monkeypatch):
    signal_self_at_step(monkeypatch, at_step=3, signums=[signal.SIGTERM])
    out = tmp_path / "unsaved"
    code, stdout, err = run([*base, "--checkpoint_every", "0", "--max_steps", "10", "--out_dir", out], capsys)
    said = stdout + err
    assert code == 143 and "SIGTERM: stopping after this step (this run writes no checkpoints)" in said
    assert "with a checkpoint" not in said and not (out / CHECKPOINT_NAME).exists()


@pytest.mark.slow
def test_sigterm_before_training_ends_with_a_message(tmp_path, token_files):
    # The process is signalled while it prepares (here: right at the start of training_run): exit 143, a message.
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        sys.path.insert(0, {str(REPO)!r})
        import train_h100
        from cs336_basics import run
        real = run.prepare_data
        def prepare_then_terminated(*a, **k):
            os.kill(os.getpid(), signal.SIGTERM)
            return real(*a, **k)
        run.prepare_data = prepare_then_terminated
        sys.exit(train_h100.main(sys.argv[1:]))
        """
    )
    argv = [*TINY_FLAGS, *token_files, "--out_dir", str(tmp_path / "early")]
    proc = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 143, proc.stderr
    assert "stopped by SIGTERM" in proc.stderr and "No checkpoint was saved" in proc.stderr


# ---- 5. a failed resume leaves the folder as it was ----


def test_a_resume_that_does_not_fit_writes_nothing(tmp_path, base, capsys):
    out = tmp_path / "run"
    assert run([*base, "--max_steps", "3", "--checkpoint_every", "3", "--out_dir", out], capsys)[0] == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    code, _, err = run(["--resume", "--out_dir", out, "--dim", "64"], capsys)
    assert code == 2 and "trained with another model (dim 32 -> 64)" in err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    # ... so a plain --resume still works afterwards.
    code, _, err = run(["--resume", "--out_dir", out, "--max_steps", "5"], capsys)
    assert code == 0, err


def test_resume_into_a_missing_folder_creates_nothing(tmp_path, capsys):
    code, _, err = run(["--resume", "--out_dir", tmp_path / "nowhere", "--device", "cpu"], capsys)
    assert code == 2 and "does not exist" in err
    assert not (tmp_path / "nowhere").exists()


def test_resuming_a_finished_run_leaves_its_results_alone(tmp_path, base, capsys):
    out = tmp_path / "run"
    assert run([*base, "--max_steps", "3", "--out_dir", out], capsys)[0] == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    code, stdout, _ = run(["--resume", "--out_dir", out], capsys)
    assert code == 0 and "nothing to do" in stdout
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


def test_resume_with_another_tokenizer_is_refused(tmp_path, capsys):
    text_a, text_b = tmp_path / "a.txt", tmp_path / "b.txt"
    text_a.write_text("def add(a, b):\n    return a + b\n\n" * 300)
    text_b.write_text("the cat sat on the mat and the dog ran far away\n" * 300)
    common = [*TINY_FLAGS, "--vocab_size", "300", "--eval_every", "0", "--cache_dir", tmp_path / "cache"]
    out = tmp_path / "run"
    assert run([*common, "--train_data", text_a, "--max_steps", "2", "--out_dir", out], capsys)[0] == 0
    code, _, err = run(["--resume", "--out_dir", out, "--train_data", text_b, "--max_steps", "4"], capsys)
    assert code == 2 and "tokenizer differs" in err


# ---- 6. no debris left by kills ----


def test_stale_temporary_files_of_this_program_are_removed_at_start(tmp_path, base, capsys, dead_pid):
    out = tmp_path / "run"
    assert run([*base, "--max_steps", "2", "--out_dir", out], capsys)[0] == 0
    stale = [out / f"{temp_prefix(name, pid=dead_pid)}k1ll3d" for name in ("checkpoint.pt", "result.json")]
    stale_dir = out / "tokenizer" / f"{temp_prefix('tokenizer', pid=dead_pid)}x"
    stale_dir.mkdir(parents=True)
    (stale_dir / "vocab.json").write_text("{")
    live = out / f"{temp_prefix('config.json')}x"  # this process's: a writer that is still alive
    elsewhere = out / "notes" / f"{temp_prefix('checkpoint.pt', pid=dead_pid)}x"  # not where the run writes
    elsewhere.parent.mkdir()
    for p in [*stale, live, elsewhere]:
        p.write_bytes(b"half a file")
    code, _, err = run(["--resume", "--out_dir", out, "--max_steps", "3"], capsys)
    assert code == 0, err
    assert not any(p.exists() for p in [*stale, stale_dir])
    assert live.exists() and elsewhere.exists()


def test_the_users_hidden_temporary_files_in_the_run_folder_are_kept(tmp_path, base, capsys):
    out = tmp_path / "d"
    mine = {
        out / "notes" / "deep" / ".draft.tmp": "x",
        out / ".tmp-photos" / "cat.jpg": "y",
        out / ".notes.tmp": "z",
        out / ".config.json.a1b2.tmp": "w",
    }
    for path, text in mine.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert run([*base, "--max_steps", "2", "--out_dir", out], capsys)[0] == 0
    assert run(["--resume", "--out_dir", out, "--max_steps", "3"], capsys)[0] == 0
    assert {path: path.read_text() for path in mine if path.exists()} == mine


# ---- 7. symbolic links: the run never writes, nor deletes, through a link inside its folder ----


def test_a_lock_or_run_file_that_is_not_a_plain_file_is_refused_and_nothing_is_written_through_it(
    tmp_path, base, capsys
):
    out = tmp_path / "run"
    assert run([*base, "--max_steps", "2", "--checkpoint_every", "2", "--out_dir", out], capsys)[0] == 0
    victim, victim_dir, nowhere = tmp_path / "victim.txt", tmp_path / "victim", tmp_path / "nowhere.txt"
    victim.write_text("data")
    (victim_dir / "step-1").mkdir(parents=True)
    (victim_dir / "step-1" / "keep.txt").write_text("data")
    moved = tmp_path / "moved"  # where a user moved the run's own file, leaving a link in its place
    moved.mkdir()
    resume = ["--resume", "--out_dir", out, "--max_steps", "4"]
    overwrite = [*base, "--overwrite", "--max_steps", "4", "--out_dir", out]
    cases = [(".lock", victim, resume), (".lock", nowhere, resume), (".lock", None, resume)]
    for name in RUN_FILES:
        other = victim_dir if name in ("tokenizer", "checkpoint.shards") else victim
        cases.append((name, moved / name if (out / name).exists() else other, resume))
    cases += [("metrics.jsonl", nowhere, resume), ("metrics.jsonl", nowhere, overwrite)]
    cases += [("tokenizer", nowhere, overwrite)]

    def outside() -> dict[Path, bytes]:
        return {p: p.read_bytes() for root in (victim_dir, moved) for p in root.rglob("*") if p.is_file()}

    for name, target, argv in cases:
        path, aside = out / name, tmp_path / "aside"
        if os.path.lexists(path):
            path.rename(target if target == moved / name else aside)
        os.mkfifo(path) if target is None else path.symlink_to(target)
        before = outside()
        code, stdout, err = run(argv, capsys)
        assert code == 2 and error_lines(err) == err.strip().splitlines(), (name, target, err)
        assert str(path) in err and ("symbolic link" in err if target else "not a regular file" in err), err
        assert "FINAL CONFIGURATION SUMMARY" not in stdout
        assert outside() == before and victim.read_text() == "data" and not nowhere.exists()
        path.unlink()
        for was in (aside, moved / name):
            if was.exists():
                was.rename(path)
    code, _, err = run(resume, capsys)  # the folder, its links removed, resumes
    assert code == 0, err


def test_a_run_folder_that_is_a_link_to_a_folder_works(tmp_path, base, capsys):
    # --out_dir may be a link (a run kept on another disk); only links inside the folder are refused.
    real, link = tmp_path / "disk" / "run", tmp_path / "run"
    real.mkdir(parents=True)
    link.symlink_to(real)
    assert run([*base, "--max_steps", "2", "--checkpoint_every", "2", "--out_dir", link], capsys)[0] == 0
    code, _, err = run(["--resume", "--out_dir", link, "--max_steps", "3"], capsys)
    assert code == 0, err
    assert link.is_symlink() and not any(p.is_symlink() for p in real.iterdir())
    assert (real / CHECKPOINT_NAME).is_file() and (real / ".lock").is_file()
    assert read_metrics(real / "metrics.jsonl")[-1]["step"] == 3


def test_atomic_writes_replace_a_link_and_never_write_through_it(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("data")
    link = tmp_path / "config.json"
    link.symlink_to(victim)
    write_json_atomic(link, {"step": 1})
    assert not link.is_symlink() and json.loads(link.read_text()) == {"step": 1}
    assert victim.read_text() == "data"


@pytest.mark.parametrize("resume_from_step", [None, 3])
def test_the_metrics_log_never_appends_through_a_link(tmp_path, resume_from_step):
    nowhere, link = tmp_path / "nowhere.txt", tmp_path / "metrics.jsonl"
    link.symlink_to(nowhere)
    with pytest.raises(OSError):
        MetricsLog(link, resume_from_step=resume_from_step).close()
    assert not nowhere.exists()


# ---- settings and folders that cannot work: one line each, nothing written ----


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--lr", "-0.01"], "lr must be > 0"),
        (["--lr", "0"], "lr must be > 0"),
        (["--lr", "1e39"], "lr must be > 0 and at most"),
        (["--batch_size", "0"], "batch_size must be >= 1"),
        (["--batch_size", "-2"], "batch_size must be >= 1"),
        (["--gradient_accumulation_steps", "0"], "gradient_accumulation_steps must be >= 1"),
        (["--log_every", "0"], "log_every must be >= 1"),
        (["--eval_batches", "0"], "eval_batches must be >= 1"),
        (["--beta1", "1.5"], "beta1 must be in [0, 1)"),
        (["--warmup_steps", "-5"], "warmup_steps must be >= 0"),
        (["--eval_every", "-3"], "eval_every must be >= 0"),
        (["--checkpoint_every", "-1"], "checkpoint_every must be >= 0"),
    ],
)
def test_out_of_range_settings_fail_before_anything_runs(tmp_path, base, capsys, flags, message):
    code, stdout, err = run([*base, *flags, "--out_dir", tmp_path / "r"], capsys)
    assert code == 2 and error_lines(err) == [f"error: {err.split('error: ')[1].strip()}"]
    assert message in err and "Traceback" not in err
    assert "FINAL CONFIGURATION SUMMARY" not in stdout and not (tmp_path / "r").exists()


def test_bad_types_in_a_config_file_fail_in_one_line(tmp_path, capsys):
    for values, message in (
        ({"train": {"max_steps": "ten"}}, "max_steps must be an integer"),
        ({"model": {"dim": "64"}}, "dim must be an integer"),
        ({"train": {"resume": "no"}}, "resume must be true or false"),
    ):
        config = tmp_path / "c.json"
        config.write_text(json.dumps(values))
        code, _, err = run(["--device", "cpu", "--config", config, "--out_dir", tmp_path / "r"], capsys)
        assert code == 2 and message in err and "Traceback" not in err
        assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    "text, problem",
    [("{}", 'it has no "runs" list'), ('{"runs": {}}', 'its "runs" is not a list'), ("[]", 'it has no "runs" list'),
     ("not json", "it is not JSON"), ("\xff", "it is not JSON"), ("[" * 100_000, "it is not JSON")],
)  # fmt: skip
def test_a_results_json_that_is_not_a_results_file_is_refused_before_training(tmp_path, base, capsys, text, problem):
    results = tmp_path / "results.json"
    results.write_bytes(text.encode("latin-1"))
    argv = [*base, "--max_steps", "2", "--out_dir", tmp_path / "r", "--results_json", results]
    code, stdout, err = run(argv, capsys)
    assert code == 2 and error_lines(err) == err.strip().splitlines() and len(error_lines(err)) == 1, err
    assert f"--results_json {results} cannot be used: {problem}" in err
    assert "FINAL CONFIGURATION SUMMARY" not in stdout and not (tmp_path / "r").exists()
    assert results.read_bytes() == text.encode("latin-1")


def test_a_results_json_gets_the_run_appended(tmp_path, base, capsys):
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"gpu": None, "runs": [{"preset": "earlier"}]}))
    code, _, err = run([*base, "--max_steps", "2", "--out_dir", tmp_path / "r", "--results_json", results], capsys)
    assert code == 0, err
    runs = json.loads(results.read_text())["runs"]
    assert [r["preset"] for r in runs] == ["earlier", "cpu-small"] and runs[1]["steps"] == 2


def test_an_out_dir_that_is_a_file_is_refused(tmp_path, base, capsys):
    (tmp_path / "file").write_text("not a folder")
    code, _, err = run([*base, "--out_dir", tmp_path / "file"], capsys)
    assert code == 2 and "is a file, not a folder" in err


def test_an_unwritable_out_dir_is_one_line(tmp_path, base, capsys):
    target = Path("/sys/kernel")  # read-only for every user, root included, where sysfs is mounted
    if not target.is_dir() or os.access(target, os.W_OK) and _can_create(target):
        pytest.skip("no read-only folder to test against on this machine")
    code, _, err = run([*base, "--out_dir", target], capsys)
    assert code == 2 and "/sys/kernel cannot be written" in err and "Traceback" not in err


def _can_create(folder: Path) -> bool:
    try:
        (folder / ".cs336-probe").touch()
    except OSError:
        return False
    (folder / ".cs336-probe").unlink()
    return True


def test_a_full_disk_at_checkpoint_time_keeps_the_previous_checkpoint(tmp_path, base, capsys, monkeypatch):
    out = tmp_path / "full"
    real_save = checkpoint_module.torch.save
    saves = []

    def disk_fills_on_the_second_save(obj, f):
        saves.append(1)
        if len(saves) == 2:
            f.write(b"PK\x03\x04 part of a zip")
            raise RuntimeError(
                "[enforce fail at inline_container.cc:778] . PytorchStreamWriter failed writing file data/3: "
                "file write failed"
            )
        real_save(obj, f)

    monkeypatch.setattr(checkpoint_module.torch, "save", disk_fills_on_the_second_save)
    code, _, err = run([*base, "--checkpoint_every", "2", "--max_steps", "8", "--out_dir", out], capsys)
    assert code == 1 and len(error_lines(err)) == 1 and "Traceback" not in err
    assert "could not write" in err and "the disk is full" in err and "checkpoint from step 2" in err
    assert load_checkpoint(out / CHECKPOINT_NAME, restore_rng=False)["step"] == 2
    assert not [p for p in out.iterdir() if p.name.startswith(TEMP_PREFIX)]


@pytest.mark.slow
def test_a_data_path_error_comes_before_heavy_imports(tmp_path):
    # torchao takes seconds to import: a wrong path must fail before anything imports it.
    script = (
        "import sys, train_h100; code = train_h100.main(sys.argv[1:]); "
        "print('torchao imported' if 'torchao' in sys.modules else 'torchao not imported'); sys.exit(code)"
    )
    argv = [*TINY_FLAGS, "--train_data", str(tmp_path / "missing.npy"), "--out_dir", str(tmp_path / "r")]
    proc = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 2 and "missing.npy does not exist" in proc.stderr
    assert "torchao not imported" in proc.stdout
    assert not (tmp_path / "r").exists()


# ---- extending a run keeps its learning-rate schedule continuous ----


def test_a_resume_with_a_larger_global_batch_reports_the_tokens_trained(tmp_path, base, capsys):
    out = tmp_path / "run"
    assert run([*base, "--max_steps", "4", "--checkpoint_every", "2", "--out_dir", out], capsys)[0] == 0
    bigger = ["--batch_size", "8", "--gradient_accumulation_steps", "2"]
    code, stdout, _ = run(["--resume", "--out_dir", out, "--max_steps", "6", *bigger], capsys)
    trained = (4 * 4 + 2 * 16) * 16  # steps x sequences x context_length
    assert code == 0 and f"done: 6 steps, {trained:,} tokens" in stdout
    assert json.loads((out / "result.json").read_text())["tokens"] == trained


def test_a_resume_with_another_seed_is_refused_and_the_run_left_as_it_was(tmp_path, base, capsys):
    out = tmp_path / "run"
    assert run([*base, "--max_steps", "2", "--checkpoint_every", "2", "--out_dir", out], capsys)[0] == 0
    before = (out / "config.json").read_bytes()
    code, _, err = run(["--resume", "--out_dir", out, "--max_steps", "4", "--seed", "9"], capsys)
    assert code == 2 and "was started with --seed 0, not 9" in err
    assert (out / "config.json").read_bytes() == before
    assert run(["--resume", "--out_dir", out, "--max_steps", "4", "--seed", "0"], capsys)[0] == 0  # the same: fine


def test_a_resume_with_a_config_file_changes_only_what_the_file_says(tmp_path, base, capsys):
    """The run's own settings stay the layer under the file: --config on a resume changes what it names, not the
    rest back to the preset's."""
    out = tmp_path / "run"
    argv = [*base, "--lr", "1e-3", "--log_every", "1", "--max_steps", "2", "--checkpoint_every", "2", "--out_dir", out]
    assert run(argv, capsys)[0] == 0
    tweak = tmp_path / "tweak.json"
    tweak.write_text(json.dumps({"train": {"max_steps": 4}}))
    code, stdout, _ = run(["--resume", "--out_dir", out, "--config", tweak], capsys)
    assert code == 0 and "learning rate at step" not in stdout  # the schedule is the run's
    saved = json.loads((out / "config.json").read_text())
    assert (saved["optim"]["lr"], saved["train"]["log_every"], saved["train"]["max_steps"]) == (1e-3, 1, 4)
    assert saved["model"]["dim"] == 32 and [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3, 4]


def test_a_resume_whose_config_json_is_lost_takes_the_settings_its_checkpoint_records(tmp_path, base, capsys):
    out = tmp_path / "run"
    argv = [*base, "--lr", "1e-3", "--log_every", "1", "--max_steps", "2", "--checkpoint_every", "2", "--out_dir", out]
    assert run([*argv, "--overwrite"], capsys)[0] == 0  # how it started is not a setting of the resume
    (out / "config.json").unlink()
    code, stdout, _ = run(["--resume", "--out_dir", out, "--max_steps", "3"], capsys)
    assert code == 0 and "learning rate at step" not in stdout
    saved = json.loads((out / "config.json").read_text())
    assert (saved["optim"]["lr"], saved["train"]["log_every"], saved["model"]["dim"]) == (1e-3, 1, 32)
    # Neither a config.json nor a checkpoint that reads: the resume's own check of the checkpoint says so.
    (out / "config.json").unlink()
    (out / CHECKPOINT_NAME).write_bytes(b"")
    code, _, err = run(["--resume", "--out_dir", out, "--max_steps", "4"], capsys)
    assert code == 2 and "is not a readable checkpoint" in err


def test_a_resume_with_another_batch_says_so(tmp_path, base, capsys):
    out = tmp_path / "run"
    assert run([*base, "--max_steps", "2", "--checkpoint_every", "2", "--out_dir", out], capsys)[0] == 0
    code, stdout, _ = run(["--resume", "--out_dir", out, "--max_steps", "3", "--batch_size", "8"], capsys)
    said = " ".join(stdout.split())
    assert code == 0 and "tokens per step 64 -> 128: the batch, micro-batches or ranks differ" in said


def test_a_resume_in_another_precision_says_so(tmp_path, base, capsys):
    """FP8 left automatic is chosen again on resume (config.json keeps it as asked): on a machine that chooses
    otherwise, or with another precision asked for, the summary says the run goes on in another precision."""
    out = tmp_path / "run"
    fp8 = ["--use_fp8", "--fp8_emulate", "--dtype", "bfloat16"]  # TorchAO's emulated FP8 on the CPU
    assert run([*base, *fp8, "--max_steps", "2", "--checkpoint_every", "2", "--out_dir", out], capsys)[0] == 0
    code, stdout, _ = run(["--resume", "--out_dir", out, "--max_steps", "3", "--no_use_fp8"], capsys)
    assert code == 0 and "precision FP8 (bfloat16 weights) -> bfloat16: the run goes on" in " ".join(stdout.split())
    # Its config.json now asks for BF16: the next resume goes on as the last, without the note.
    code, stdout, _ = run(["--resume", "--out_dir", out, "--max_steps", "4"], capsys)
    assert code == 0 and "another precision" not in stdout and "FP8 linears counted" not in stdout


def test_a_resume_on_other_data_says_so(tmp_path, base, capsys, token_files):
    out = tmp_path / "run"
    assert run([*base, "--max_steps", "2", "--checkpoint_every", "2", "--out_dir", out], capsys)[0] == 0
    other = tmp_path / "other.npy"
    other.write_bytes(Path(token_files[1]).read_bytes())
    code, stdout, _ = run(["--resume", "--out_dir", out, "--max_steps", "3", "--train_data", other], capsys)
    assert code == 0 and f"train_data {token_files[1]} -> {other}: it trains on other data" in " ".join(stdout.split())


def test_a_run_that_never_evaluates_needs_no_validation_windows(tmp_path, token_files, capsys):
    short_val = tmp_path / "short_val.npy"
    np.save(short_val, np.arange(10, dtype=np.uint16))  # fewer tokens than one window of 16
    argv = [*TINY_FLAGS, "--train_data", token_files[1], "--val_data", short_val, "--max_steps", "1"]
    code, _, err = run([*argv, "--out_dir", tmp_path / "evaluates"], capsys)
    assert code == 2 and "longer than the validation data (10 tokens)" in err and "or --eval_every 0" in err
    assert run([*argv, "--eval_every", "0", "--out_dir", tmp_path / "never"], capsys)[0] == 0


def test_the_summary_says_which_of_the_presets_model_settings_were_changed(tmp_path, base, capsys, token_files):
    code, stdout, _ = run([*base, "--max_steps", "1", "--out_dir", tmp_path / "tiny"], capsys)
    changed = "dim, n_layers, n_heads, intermediate_size, vocab_size, context_length"
    assert code == 0 and f"preset cpu-small with its {changed} changed: dim 32," in stdout
    code, stdout, _ = run([*base, "--max_steps", "1", "--n_layers", "4", "--dim", "128", "--n_heads", "4",
                           "--intermediate_size", "384", "--vocab_size", "2048", "--context_length", "128",
                           "--out_dir", tmp_path / "preset"], capsys)  # fmt: skip
    assert code == 0 and "preset cpu-small: dim 128," in stdout


def test_a_cosine_that_ends_before_max_steps_is_named_in_the_summary(tmp_path, base, capsys):
    argv = [*base, "--lr_decay_steps", "3", "--warmup_steps", "1", "--max_steps", "5", "--out_dir", tmp_path / "run"]
    code, stdout, _ = run(argv, capsys)
    assert code == 0 and "the cosine ends at step 3 of 5" in " ".join(stdout.split())


@pytest.mark.parametrize(
    "content, message",
    [
        (b"\xff\xfe{", "is not UTF-8 text"),
        (b'{"train": {"max_steps": 3}, "train": {"seed": 1}}', "gives 'train' twice in one object"),
    ],
    ids=["not_utf8", "a_key_twice"],
)
def test_a_config_file_that_cannot_be_read_as_written_is_one_error_line(tmp_path, base, capsys, content, message):
    path = tmp_path / "config.json"
    path.write_bytes(content)
    code, _, err = run([*base, "--config", path, "--out_dir", tmp_path / "run"], capsys)
    assert code == 2 and message in err and "Traceback" not in err and not (tmp_path / "run").exists()


def test_a_config_file_with_a_byte_order_mark_is_read(tmp_path, base, capsys):
    path = tmp_path / "config.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"train": {"max_steps": 1}}).encode())
    assert run([*base, "--config", path, "--out_dir", tmp_path / "run"], capsys)[0] == 0


def test_config_given_twice_and_a_seed_torch_cannot_take_are_refused(tmp_path, base, capsys):
    path = tmp_path / "config.json"
    path.write_text("{}")
    with pytest.raises(SystemExit) as stop:
        run([*base, "--config", path, "--config", path, "--out_dir", tmp_path / "run"], capsys)
    assert stop.value.code == 2 and "--config is given twice" in capsys.readouterr().err
    code, _, err = run([*base, "--seed", str(2**64), "--out_dir", tmp_path / "run"], capsys)
    assert code == 2 and "seed must be in [0, 2**64)" in err and "Traceback" not in err


def test_a_context_longer_than_memory_could_hold_is_refused_by_the_data_check(tmp_path, base, capsys):
    """The plan builds the model on "meta" (shapes only): RoPE's tables there take no memory either, so the data's
    check refuses the context, instead of an allocation failing first."""
    code, _, err = run([*base, "--context_length", str(10**12), "--out_dir", tmp_path / "run"], capsys)
    assert code == 2 and "is longer than the training data" in err and "Traceback" not in err


def test_a_warmup_longer_than_the_schedule_is_named_in_the_summary(tmp_path, base, capsys):
    code, stdout, _ = run([*base, "--warmup_steps", "5", "--max_steps", "3", "--out_dir", tmp_path / "run"], capsys)
    said = " ".join(stdout.split())
    assert code == 0 and "cosine (warmup 5, min_lr from step 5)" in said
    assert "the warmup outlasts the cosine (3 steps): the rate climbs until step 5" in said


def test_extending_a_run_keeps_the_schedule_continuous(tmp_path, base, capsys):
    out = tmp_path / "run"
    argv = [*base, "--log_every", "1", "--warmup_steps", "2", "--lr", "1e-3", "--min_lr", "1e-4"]
    assert run([*argv, "--max_steps", "10", "--out_dir", out], capsys)[0] == 0
    code, stdout, _ = run(["--resume", "--out_dir", out, "--max_steps", "20"], capsys)
    assert code == 0 and "the learning rate reaches min_lr at step 10 and stays there" in " ".join(stdout.split())
    lrs = [r["lr"] for r in read_metrics(out / "metrics.jsonl")]
    after_warmup = lrs[2:]
    assert len(lrs) == 20 and all(b <= a for a, b in zip(after_warmup, after_warmup[1:], strict=False))
    assert lrs[10:] == [pytest.approx(1e-4)] * 10
    # Asking for a longer decay on resume is allowed, and the summary says the learning rate jumps.
    code, stdout, _ = run(["--resume", "--out_dir", out, "--max_steps", "30", "--lr_decay_steps", "40"], capsys)
    assert code == 0 and "the learning rate at step 20 changes from 0.0001 to" in stdout
