"""Every failure is one line and nothing is lost: the bad inputs and faults of the reliability round-2 issue, each of
which ended in a Python traceback (or was accepted silently) before, plus every program run with a bad input."""

from __future__ import annotations

import errno
import shutil
import signal
import struct
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from tiny import TINY_FLAGS, tiny_model

import train_h100
import verify_fp8_compilation
from cs336_basics.config import DataConfig
from cs336_basics.data import prepare_data
from cs336_basics.errors import ConfigError
from cs336_basics.files.atomic import TEMP_PREFIX
from cs336_basics.files.integrity import ChecksumError, files_crc32, verify_files, verify_zip
from cs336_basics.model import TransformerLM
from cs336_basics.programs import generate
from cs336_basics.sweep import cli as sweep_cli
from cs336_basics.training.checkpoint import CHECKPOINT_NAME, read_checkpoint
from cs336_basics.training.signals import Interrupted

REPO = Path(__file__).resolve().parents[1]
FIXTURE_RUN = Path(__file__).parent / "fixtures" / "run-6d81725"
TEXT = "def add(a, b):\n    return a + b\n\nclass Point:\n    x: int = 0\n\n" * 200


def one_error_line(err: str) -> str:
    """The single user-facing error line a failed program printed (and no traceback)."""
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    return lines[0]


def run_main(main, argv, capsys) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err


@pytest.fixture
def base(token_files):
    return [*TINY_FLAGS, *token_files, "--eval_every", "0"]


def flip_a_weight_bit(checkpoint: Path) -> None:
    """Flip one bit inside the first large tensor record of a torch.save file, as a disk error would."""
    with zipfile.ZipFile(checkpoint) as archive:
        record = next(r for r in archive.infolist() if "/data/" in r.filename and r.file_size >= 64)
    with checkpoint.open("r+b") as f:
        f.seek(record.header_offset)
        header = f.read(30)
        name_len, extra_len = struct.unpack("<HH", header[26:30])
        where = record.header_offset + 30 + name_len + extra_len + record.file_size // 2
        f.seek(where)
        byte = f.read(1)[0]
        f.seek(where)
        f.write(bytes([byte ^ 0x08]))


# ---- the data cache is checked when it is read ----


def _text_data(tmp_path: Path) -> DataConfig:
    (tmp_path / "train.txt").write_text(TEXT)
    return DataConfig(train_data=str(tmp_path / "train.txt"), cache_dir=str(tmp_path / "cache"))


def _cached_array(tmp_path: Path) -> Path:
    (path,) = (tmp_path / "cache").glob("text-*/train-*.npy")
    return path


def test_a_truncated_cached_token_array_is_encoded_again(tmp_path, capsys):
    cfg = _text_data(tmp_path)
    first = np.asarray(prepare_data(cfg, 300).train).copy()
    cached = _cached_array(tmp_path)
    with cached.open("r+b") as f:  # what a killed writer or a full disk leaves
        f.truncate(cached.stat().st_size // 2)
    again = prepare_data(cfg, 300)
    assert np.array_equal(np.asarray(again.train), first)
    assert "cannot be used" in capsys.readouterr().err


def test_a_cached_array_with_ids_outside_the_vocabulary_is_encoded_again(tmp_path, capsys):
    cfg = _text_data(tmp_path)
    first = np.asarray(prepare_data(cfg, 300).train).copy()
    stale = np.load(_cached_array(tmp_path)).copy()
    stale[3] = 299 + 40  # a cache written by another tokenizer: an id this one does not have
    np.save(_cached_array(tmp_path), stale)
    again = prepare_data(cfg, 300)
    assert np.array_equal(np.asarray(again.train), first) and int(np.max(again.train)) < 300
    assert "contains token id 339" in capsys.readouterr().err


def test_a_damaged_cached_tokenizer_rebuilds_its_entry(tmp_path):
    cfg = _text_data(tmp_path)
    first = np.asarray(prepare_data(cfg, 300).train).copy()
    (tokenizer_json,) = (tmp_path / "cache").glob("text-*/tokenizer/tokenizer.json")
    tokenizer_json.write_text('{"cut sho')
    assert np.array_equal(np.asarray(prepare_data(cfg, 300).train), first)


def test_a_damaged_cache_that_cannot_be_removed_names_cache_dir(tmp_path, monkeypatch):
    cfg = _text_data(tmp_path)
    prepare_data(cfg, 300)
    cached = _cached_array(tmp_path)
    cached.write_bytes(cached.read_bytes()[:200])

    def read_only(self, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.setattr(Path, "unlink", read_only)
    with pytest.raises(ConfigError, match="--cache_dir") as info:
        prepare_data(cfg, 300)
    assert str(cached) in str(info.value) and "read-only" in str(info.value)


def test_a_run_with_a_damaged_cache_trains(tmp_path, capsys):
    common = [*TINY_FLAGS, "--vocab_size", "300", "--eval_every", "0", "--max_steps", "2"]
    common += ["--train_data", tmp_path / "train.txt", "--cache_dir", tmp_path / "cache"]
    (tmp_path / "train.txt").write_text(TEXT)
    assert run_main(train_h100.main, [*common, "--out_dir", tmp_path / "a"], capsys)[0] == 0
    stale = np.load(_cached_array(tmp_path)).copy()
    stale[::7] = 299 + 40
    np.save(_cached_array(tmp_path), stale)
    code, err = run_main(train_h100.main, [*common, "--out_dir", tmp_path / "b"], capsys)
    assert code == 0 and "building it again" in err


# ---- outputs that cannot be written ----


def test_a_full_disk_at_the_loss_curve_is_one_line_and_keeps_the_checkpoint(tmp_path, base, capsys, monkeypatch):
    import matplotlib.figure

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", disk_full)
    out = tmp_path / "run"
    code, err = run_main(train_h100.main, [*base, "--max_steps", "4", "--out_dir", out], capsys)
    line = one_error_line(err)
    assert code == 1 and "loss_curve.png" in line and "the disk is full" in line and "is intact" in line
    assert read_checkpoint(out / CHECKPOINT_NAME)["step"] == 4
    assert not [p for p in out.iterdir() if p.name.startswith(TEMP_PREFIX)]


def test_a_full_disk_at_the_tokenizer_is_one_line(tmp_path, capsys, monkeypatch):
    import tokenizers

    out, real_save = tmp_path / "run", tokenizers.Tokenizer.save

    def full_in_the_run_folder(self, path, *args, **kwargs):
        if Path(path).is_relative_to(out):  # the data cache's copy, written first, fits
            raise Exception("No space left on device (os error 28)")  # what the library raises for any I/O error
        return real_save(self, path, *args, **kwargs)

    monkeypatch.setattr(tokenizers.Tokenizer, "save", full_in_the_run_folder)
    (tmp_path / "train.txt").write_text(TEXT)
    data = ["--vocab_size", "300", "--train_data", tmp_path / "train.txt", "--cache_dir", tmp_path / "cache"]
    code, err = run_main(train_h100.main, [*TINY_FLAGS, *data, "--max_steps", "2", "--out_dir", out], capsys)
    line = one_error_line(err)
    assert code == 1 and f"could not write {out / 'tokenizer'}: the disk is full. Nothing was trained." in line


OUT_OF_MEMORY = {  # what the CUDA allocator, the CPU allocator and Python raise when an allocation fails
    "cuda": lambda: torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has ..."),
    "cpu": lambda: RuntimeError(
        "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: you tried to allocate "
        "17179869184 bytes. Error code 12 (Cannot allocate memory)"
    ),
    "python": MemoryError,
}


@pytest.mark.parametrize("error", OUT_OF_MEMORY.values(), ids=OUT_OF_MEMORY.keys())
def test_out_of_memory_is_one_line_naming_the_batch_and_the_flags_that_lower_it(
    tmp_path, base, capsys, monkeypatch, error
):
    from cs336_basics.training.trainer import Trainer

    real_step = Trainer.train_step

    def third_step_runs_out(self):
        if self.step == 2:
            raise error()
        return real_step(self)

    monkeypatch.setattr(Trainer, "train_step", third_step_runs_out)
    out = tmp_path / "run"
    argv = [*base, "--max_steps", "4", "--checkpoint_every", "2", "--out_dir", out]
    code, err = run_main(train_h100.main, argv, capsys)
    line = one_error_line(err)
    assert code == 1 and line.startswith("error: out of memory") and "at step 3" in line
    assert "4 x 16 tokens" in line  # --batch_size x --context_length
    for flag in ("--batch_size", "--gradient_accumulation_steps", "--gradient_checkpointing"):
        assert flag in line
    assert line.endswith(f"The checkpoint from step 2, {out / CHECKPOINT_NAME}, is intact.")


def test_a_full_disk_at_the_result_file_is_one_line(tmp_path, base, capsys, monkeypatch):
    import cs336_basics.run as run_module

    real = run_module.write_json_atomic

    def result_fails(path, data):
        if Path(path).name == "result.json":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, data)

    monkeypatch.setattr(run_module, "write_json_atomic", result_fails)
    code, err = run_main(train_h100.main, [*base, "--max_steps", "2", "--out_dir", tmp_path / "run"], capsys)
    line = one_error_line(err)
    assert code == 1 and "result.json" in line and "The training finished" in line


def test_an_out_dir_name_too_long_is_one_line(tmp_path, base, capsys):
    code, err = run_main(train_h100.main, [*base, "--out_dir", tmp_path / ("x" * 300)], capsys)
    assert code == 2 and "longer than the file system allows" in one_error_line(err)


def test_the_sweeps_out_dir_naming_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("not a folder")
    code, err = run_main(sweep_cli.main, ["--out_dir", tmp_path / "file", "--dry_run"], capsys)
    assert code == 2 and "is a file, not a folder" in one_error_line(err)


def test_an_unwritable_json_is_refused_before_the_verification_runs(tmp_path, capsys, monkeypatch):
    ran = []
    monkeypatch.setattr(verify_fp8_compilation, "verify_fp8", lambda *a: ran.append(1))
    code, err = run_main(verify_fp8_compilation.main, ["--json", tmp_path], capsys)  # a folder, not a file
    assert code == 2 and "--json" in one_error_line(err) and not ran


def test_a_json_write_that_fails_after_the_verification_is_one_line(tmp_path, capsys, monkeypatch):
    result = SimpleNamespace(
        table=lambda: "the checks", passed=True, checks=[], runs=[], to_dict=lambda: {"passed": True}
    )
    monkeypatch.setattr(verify_fp8_compilation, "verify_fp8", lambda *a, **k: result)

    def read_only(path, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(verify_fp8_compilation, "write_results", read_only)
    code, err = run_main(verify_fp8_compilation.main, ["--json", tmp_path / "v.json", "--device", "cpu"], capsys)
    line = one_error_line(err)
    assert code == 1 and "read-only" in line and "table is printed above" in line


def test_a_read_only_folder_is_refused_up_front(tmp_path, capsys):
    target = Path("/sys/kernel")  # read-only for every user, root included, where sysfs is mounted
    try:
        (target / ".cs336-probe").touch()
    except OSError:
        pass
    else:
        (target / ".cs336-probe").unlink()
        pytest.skip("no read-only folder to test against on this machine")
    code, err = run_main(verify_fp8_compilation.main, ["--json", target / "v.json"], capsys)
    assert code == 2 and "cannot be written" in one_error_line(err)


# ---- generate's settings ----


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--prompt", ""], "prompt must not be empty"),
        (["--temperature", "nan"], "temperature must be a number, got nan"),
        (["--temperature", "inf"], "temperature must be a finite number"),
        (["--temperature", "-1"], "temperature must be >= 0"),
        (["--top_p", "0"], "top_p must be in (0, 1]"),
        (["--top_p", "1.5"], "top_p must be in (0, 1]"),
        (["--top_k", "-3"], "top_k must be >= 0"),
        (["--max_new_tokens", "0"], "max_new_tokens must be >= 1"),
    ],
)
def test_generate_checks_every_setting(tmp_path, capsys, flags, message):
    code, err = run_main(generate.main, ["--out_dir", tmp_path / "none", *flags], capsys)
    assert code == 2 and message in one_error_line(err)


def test_generate_without_a_checkpoint_says_where_one_is_written_and_not_how_to_resume(tmp_path, capsys):
    code, err = run_main(generate.main, ["--out_dir", tmp_path / "none", "--prompt", "x"], capsys)
    line = one_error_line(err)
    assert code == 2 and "no checkpoint file at" in line and "<out_dir>/checkpoint.pt" in line
    assert "resum" not in line


@pytest.mark.parametrize("stop, exit_code", [(KeyboardInterrupt(), 130), (Interrupted(signal.SIGTERM), 143)])
def test_generate_stopped_by_a_signal_says_so_in_one_line(tmp_path, capsys, monkeypatch, stop, exit_code):
    monkeypatch.setattr(generate, "load_trained", lambda out_dir, device, base: (None, None))

    def sampling_stopped(model, tokenizer, sampling):
        raise stop

    monkeypatch.setattr(generate, "sample_text", sampling_stopped)
    code, err = run_main(generate.main, ["--out_dir", tmp_path], capsys)
    assert code == exit_code and err.strip().splitlines()[-1].endswith("No sample was printed.")
    assert "Traceback" not in err


def test_top_k_one_is_greedy():
    torch.manual_seed(0)
    model = TransformerLM(tiny_model()).eval()
    prompt = torch.tensor([1, 2, 3])
    greedy = model.generate(prompt, 8, temperature=0)
    sampled = model.generate(prompt, 8, temperature=2.0, top_k=1, generator=torch.Generator().manual_seed(1))
    assert torch.equal(greedy, sampled)


# ---- checkpoints carry checksums, checked on every load ----


def test_a_flipped_bit_in_a_weight_is_refused_on_resume(tmp_path, base, capsys):
    out = tmp_path / "run"
    assert run_main(train_h100.main, [*base, "--max_steps", "2", "--out_dir", out], capsys)[0] == 0
    flip_a_weight_bit(out / CHECKPOINT_NAME)
    torch.load(out / CHECKPOINT_NAME, weights_only=True)  # torch itself reads it without complaint
    code, err = run_main(train_h100.main, ["--resume", "--out_dir", out, "--max_steps", "4"], capsys)
    line = one_error_line(err)
    assert code == 2 and "is damaged" in line and str(out / CHECKPOINT_NAME) in line
    with pytest.raises(ChecksumError):
        read_checkpoint(out / CHECKPOINT_NAME)
    code, err = run_main(generate.main, ["--out_dir", out], capsys)
    assert code == 2 and "is damaged" in one_error_line(err)


def test_checksums_are_written_even_when_torch_has_them_off(tmp_path, base, capsys):
    before = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(False)
    try:
        out = tmp_path / "run"
        assert run_main(train_h100.main, [*base, "--max_steps", "2", "--out_dir", out], capsys)[0] == 0
    finally:
        torch.serialization.set_crc32_options(before)
    assert verify_zip(out / CHECKPOINT_NAME)


def test_shard_files_are_checked_against_their_recorded_checksums(tmp_path):
    for name, data in (("__0_0.distcp", b"shard zero"), (".metadata", b"meta")):
        (tmp_path / name).write_bytes(data)
    recorded = files_crc32(tmp_path)
    verify_files(tmp_path, recorded)
    (tmp_path / "__0_0.distcp").write_bytes(b"shard Zero")
    with pytest.raises(ChecksumError, match="__0_0.distcp"):
        verify_files(tmp_path, recorded)


def test_a_checkpoint_written_before_checksums_were_checked_still_resumes(tmp_path, token_files, capsys):
    run = tmp_path / "run"
    shutil.copytree(FIXTURE_RUN, run)
    code, err = run_main(
        train_h100.main, ["--resume", "--out_dir", run, *token_files, "--max_steps", "5", "--checkpoint_every", "5"],
        capsys,
    )  # fmt: skip
    assert code == 0, err
    assert read_checkpoint(run / CHECKPOINT_NAME)["step"] == 5


# ---- every program, in its own process, with a bad input: one line, no traceback ----


@pytest.mark.slow
@pytest.mark.parametrize(
    "program, make_argv, exit_code",
    [
        ("train_h100.py", lambda d: ["--out_dir", d / "file"], 2),
        ("verify_fp8_compilation.py", lambda d: ["--json", d], 2),
        ("optimize_performance.py", lambda d: ["--out_dir", d / "file", "--dry_run"], 2),
        ("-m cs336_basics.programs.generate", lambda d: ["--prompt", ""], 2),
        ("-m cs336_basics.programs.merge_lora", lambda d: [d / "no-run", "--output", d / "merged.pt"], 2),
        ("-m cs336_basics.programs.export", lambda d: [d / "no-run", "--output", d], 2),
        # the merge program's old command: says where it moved instead of importing and doing nothing
        ("-m cs336_basics.lora.merge", lambda d: [d / "no-run", "--output", d / "merged.pt"], 2),
    ],
)
def test_no_program_shows_a_traceback(tmp_path, program, make_argv, exit_code):
    (tmp_path / "file").write_text("a file where a folder should be")
    argv = [sys.executable, *program.split(), *map(str, make_argv(tmp_path))]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == exit_code, proc.stderr
    one_error_line(proc.stderr)
