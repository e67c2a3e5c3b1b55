"""End-to-end runs of train_h100.py on tiny models (CPU), and every bad input it must refuse before training."""

import ast
import json
import statistics
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny import TINY_FLAGS

import train_h100
from cs336_basics.training.metrics import read_metrics
from cs336_basics.training.restore import load_checkpoint
from cs336_basics.training.trainer import WARMUP_STEPS_EXCLUDED

TINY = TINY_FLAGS


def run(argv, capsys):
    code = train_h100.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_smoke_run_writes_every_artifact_and_learns(tmp_path, token_files, capsys):
    out = tmp_path / "run"
    code, stdout, err = run(
        [
            *TINY,
            *token_files,
            "--max_steps",
            "30",
            "--log_every",
            "5",
            "--eval_every",
            "10",
            "--lr",
            "3e-3",
            "--out_dir",
            out,
        ],
        capsys,
    )
    assert code == 0, err
    assert "FINAL CONFIGURATION SUMMARY" in stdout
    assert "FP8 path need an H100-class GPU" in " ".join(stdout.split())
    for name in ("metrics.jsonl", "loss_curve.png", "checkpoint.pt", "config.json", "result.json"):
        assert (out / name).exists(), name
    records = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in records] == [5, 10, 15, 20, 25, 30]
    assert records[-1]["loss"] < records[0]["loss"] - 0.5
    assert all(r["val_loss"] is not None for r in records if r["step"] % 10 == 0)
    for key in ("tokens", "lr", "grad_norm", "tokens_per_sec", "mfu", "peak_mem_gib"):
        assert key in records[0]
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "ok" and result["precision"] == "fp32" and result["tokens_per_sec"] > 0
    tokens_per_step = result["batch_size"] * result["seq_len"] * result["gradient_accumulation_steps"]
    median_ms = 1e3 * tokens_per_step / result["tokens_per_sec"]
    assert 0 < result["step_ms_p10"] <= result["step_ms_p90"]
    assert result["step_ms_p10"] - 1e-6 <= median_ms <= result["step_ms_p90"] + 1e-6  # the spread of that median
    # Every step after the first WARMUP_STEPS_EXCLUDED (compile and warm-up), in order: their median is tokens/s's.
    assert len(result["step_ms"]) == 30 - WARMUP_STEPS_EXCLUDED
    assert statistics.median(result["step_ms"]) == pytest.approx(median_ms, rel=1e-4)
    saved = json.loads((out / "config.json").read_text())
    assert saved["model"]["dim"] == 32
    # What auto chose is chosen again on resume (another machine or world size may choose otherwise).
    assert saved["train"]["compile_mode"] == saved["train"]["compile_wrapper"] == saved["train"]["dtype"] == "auto"
    # As for FP8 on or off and compiling: a CPU run's config.json as a GPU run's --config leaves them to the GPU.
    assert saved["train"]["compile_model"] is None and saved["fp8"]["use_fp8"] is None
    for name in ("metrics.jsonl", "loss_curve.png", "checkpoint.pt", "result.json", "config.json"):
        assert str(out / name) in stdout  # the end of the run says where everything is
    # What a CPU run cannot measure reads n/a, without a unit after it.
    assert "MFU n/a, peak memory n/a, compile n/a" in stdout


def test_raw_text_data_trains_a_tokenizer_and_samples(tmp_path, capsys):
    text = "def add(a, b):\n    return a + b\n\n" * 400
    (tmp_path / "train.txt").write_text(text)
    (tmp_path / "val.txt").write_text(text[:4000])
    argv = [
        *TINY,
        "--vocab_size",
        "300",
        "--max_steps",
        "4",
        "--out_dir",
        tmp_path / "run",
        "--train_data",
        tmp_path / "train.txt",
        "--val_data",
        tmp_path / "val.txt",
        "--cache_dir",
        tmp_path / "c",
    ]
    code, stdout, err = run(argv, capsys)
    assert code == 0, err
    # The sample is printed as its repr: read it back, as repr's quotes depend on the text (4 steps of training sample
    # near-random bytes, a quote among them at times).
    samples = [
        ast.literal_eval(line.removeprefix("sample: ")) for line in stdout.splitlines() if line.startswith("sample: ")
    ]
    assert len(samples) == 1 and samples[0].startswith("def "), stdout
    assert (tmp_path / "run" / "tokenizer").is_dir()


def write_tokens(path: Path, tokens) -> str:
    np.save(path, np.asarray(tokens))
    return str(path)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--dim", "30", "--n_heads", "4"], "divisible by n_heads"),
        (["--n_heads", "4", "--n_kv_heads", "3"], "divisible by n_kv_heads"),
        (["--dim", "36", "--n_heads", "4"], "odd"),
        (["--context_length", "20000"], "longer than the training data"),
        (["--attention", "flash"], "CUDA"),
        (["--use_fp8"], "fp8"),
    ],
)
def test_bad_settings_fail_before_training(tmp_path, token_files, capsys, extra, message):
    code, stdout, err = run([*TINY, *token_files, "--out_dir", tmp_path / "run", *extra], capsys)
    assert code == 2
    assert message.lower() in err.lower()
    assert "FINAL CONFIGURATION SUMMARY" not in stdout  # refused before anything ran
    assert not (tmp_path / "run" / "checkpoint.pt").exists()


def test_bad_data_files_fail_clearly(tmp_path, capsys):
    val = write_tokens(tmp_path / "val.npy", np.zeros(100, dtype=np.uint16) + 1)
    cases = [
        (write_tokens(tmp_path / "big.npy", np.full(100, 64, dtype=np.uint16)), "vocab"),  # id 64 >= vocab 64
        (write_tokens(tmp_path / "i64.npy", np.ones(100, dtype=np.int64)), "dtype"),
        (str(tmp_path / "missing.npy"), "missing.npy"),
        (str(tmp_path / "folder.npy"), "not a regular file"),  # a folder where a file belongs
    ]
    (tmp_path / "folder.npy").mkdir()
    garbage = tmp_path / "garbage.npy"
    garbage.write_bytes(b"this is not a numpy file")
    cases.append((str(garbage), "is not a .npy file"))  # unreadable as an array (root can read any file)
    for train, message in cases:
        code, _, err = run([*TINY, "--train_data", train, "--val_data", val, "--out_dir", tmp_path / "r"], capsys)
        assert code == 2, train
        assert message in err, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_cuda_requested_without_cuda_is_an_error(tmp_path, token_files, capsys):
    code, _, err = run([*TINY, *token_files, "--device", "cuda", "--out_dir", tmp_path / "run"], capsys)
    assert code == 2 and "CUDA is not available" in err


def test_resume_without_checkpoint_is_an_error(tmp_path, token_files, capsys):
    code, _, err = run([*TINY, *token_files, "--resume", "--out_dir", tmp_path / "none"], capsys)
    assert code == 2 and "does not exist" in err


def test_emulated_fp8_run_converts_and_reports(tmp_path, token_files, capsys):
    out = tmp_path / "fp8"
    code, stdout, err = run(
        [*TINY, *token_files, "--use_fp8", "--fp8_emulate", "--max_steps", "4", "--out_dir", out], capsys
    )
    assert code == 0, err
    assert "14 of 15 linears converted" in stdout  # 2 layers x (4 attention + 3 ffn); the lm_head is skipped
    assert "14 FP8 linears counted" in stdout
    result = json.loads((out / "result.json").read_text())
    assert result["precision"] == "fp8-tensorwise-emulated"


def test_fp8_with_nothing_to_convert_is_an_error(tmp_path, token_files, capsys):
    # The shape filter rejects every layer of a tiny model: FP8 was asked for and would do nothing.
    argv = [*TINY, *token_files, "--use_fp8", "--fp8_emulate", "--fp8_shape_filter", "--out_dir", tmp_path / "r"]
    code, stdout, err = run(argv, capsys)
    assert code == 2 and "no" in err.lower() and "convert" in err.lower()
    assert "FINAL CONFIGURATION SUMMARY" not in stdout


@pytest.mark.parametrize(
    "first, then",
    [(["--no_use_fp8"], ["--use_fp8", "--fp8_emulate"]), (["--use_fp8", "--fp8_emulate"], ["--no_use_fp8"])],
)
def test_resume_may_switch_between_bf16_and_fp8(tmp_path, token_files, capsys, first, then):
    out = tmp_path / "run"
    common = [*TINY, *token_files, "--dtype", "bfloat16", "--checkpoint_every", "100", "--log_every", "1"]
    assert run([*common, *first, "--max_steps", "3", "--out_dir", out], capsys)[0] == 0
    code, _, err = run(["--resume", "--out_dir", out, "--max_steps", "6", *then], capsys)
    assert code == 0, err
    losses = [r["loss"] for r in read_metrics(out / "metrics.jsonl")]
    assert len(losses) == 6 and all(np.isfinite(losses))
    assert load_checkpoint(out / "checkpoint.pt", restore_rng=False)["step"] == 6


@pytest.mark.gpu
@pytest.mark.parametrize("precision", [["--no_use_fp8"], ["--use_fp8"]])
def test_gpu_compiled_run(tmp_path, token_files, capsys, precision):
    out = tmp_path / "gpu"
    gpu = ["--device", "cuda", "--dim", "64", "--intermediate_size", "128"]
    argv = [*TINY, *token_files, *gpu, *precision, "--compile_model", "--max_steps", "8", "--log_every", "4"]
    argv += ["--out_dir", out]
    code, stdout, err = run(argv, capsys)
    assert code == 0, err
    result = json.loads((out / "result.json").read_text())
    # --compile_mode auto: CUDA graphs for the FP8 step, not for BF16's (compiled.auto_compile_mode)
    assert result["compile"] == ("reduce-overhead" if precision == ["--use_fp8"] else "default")
    # --compile_wrapper auto: C++ where the step runs without CUDA graphs (compiled.auto_compile_wrapper)
    assert result["compile_wrapper"] == ("python" if precision == ["--use_fp8"] else "cpp")
    assert result["compile_s"] > 0 and result["peak_mem_gib"] > 0
    # Steps 3 to 8 timed, on the GPU and on the host (under CUDA graphs too: a replay is launched from the host)
    assert len(result["step_ms"]) == len(result["host_ms"][0]) == len(result["host_cpu_ms"][0]) == 6
    assert all(ms > 0 for ms in result["step_ms"] + result["host_ms"][0])
    # --use_fp8 alone: the default FP8, the fused path with delayed scaling and the FP8 lm_head (precision/choice.py)
    assert result["precision"] == ("fp8-fused-delayed" if precision == ["--use_fp8"] else "bf16")
    assert result["fp8_lm_head"] == (precision == ["--use_fp8"])
    verdict = "FP8 + Compilation" if precision == ["--use_fp8"] else "SUB-OPTIMAL"
    assert verdict in stdout


@pytest.mark.gpu
def test_gpu_cpp_wrapper_trains_like_the_python_wrapper(tmp_path, token_files, capsys):
    """FP8 without CUDA graphs: auto generates inductor's wrapper in C++ (the summary says so); the same kernels in
    the same order as the Python wrapper's, so the losses agree (to the embedding backward's atomics)."""
    gpu = ["--device", "cuda", "--dim", "64", "--intermediate_size", "128", "--use_fp8", "--no_fp8_shape_filter"]
    base = [*TINY, *token_files, *gpu, "--compile_model", "--compile_mode", "default", "--max_steps", "6"]
    losses = {}
    for wrapper in ("auto", "python"):
        out = tmp_path / wrapper
        code, stdout, err = run([*base, "--compile_wrapper", wrapper, "--log_every", "1", "--out_dir", out], capsys)
        assert code == 0, err
        assert ("C++ wrapper" in stdout) == (wrapper == "auto")
        assert json.loads((out / "result.json").read_text())["compile_wrapper"] == (
            "cpp" if wrapper == "auto" else wrapper
        )
        losses[wrapper] = [r["loss"] for r in read_metrics(out / "metrics.jsonl")]
    assert len(losses["auto"]) == 6
    assert losses["auto"] == pytest.approx(losses["python"], rel=1e-3)


def run_straight_and_split(tmp_path, token_files, capsys, flags) -> str:
    """Six steps straight, and three then resumed to six, evaluating every 2nd step: the resumed run's losses and
    evaluations must equal the straight run's, bit for bit. Returns the straight run's stdout."""
    base = [*TINY, *token_files, *flags, "--log_every", "1", "--eval_every", "2", "--lr_decay_steps", "6"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    code, stdout, err = run([*base, "--max_steps", "6", "--out_dir", straight], capsys)
    assert code == 0, err
    assert run([*base, "--max_steps", "3", "--out_dir", split], capsys)[0] == 0
    code, _, err = run(["--resume", "--out_dir", split, "--max_steps", "6"], capsys)
    assert code == 0, err
    records = read_metrics(straight / "metrics.jsonl")
    resumed = read_metrics(split / "metrics.jsonl")

    def losses(rs):  # the first half also evaluated where it stopped, at step 3: compare every 2nd step's evaluation
        return [(r["step"], r["loss"], r.get("val_loss") if r["step"] % 2 == 0 else None) for r in rs]

    assert losses(resumed) == losses(records)  # bit for bit, evaluations included
    assert all(r.get("val_loss") is not None for r in records if r["step"] % 2 == 0)
    return stdout


@pytest.mark.slow
def test_a_run_compiled_by_block_evaluates_checkpoints_and_resumes_exactly(tmp_path, token_files, capsys):
    """The blocks compiled in place: evaluation runs them eager, checkpoints load into them, the resume is exact."""
    stdout = run_straight_and_split(tmp_path, token_files, capsys, ["--compile_model", "--n_layers", "3"])
    assert "compile_scope=blocks" in stdout


@pytest.mark.gpu
def test_gpu_fp8_under_auto_cuda_graphs_evaluates_checkpoints_and_resumes_exactly(tmp_path, token_files, capsys):
    """What a run does keeps working when --compile_mode auto puts the FP8 step under CUDA graphs: evaluation (run
    eager, outside the step's graphs), delayed scaling's update, clipping, checkpoints, and an exact resume."""
    gpu = ["--device", "cuda", "--dim", "64", "--intermediate_size", "128", "--use_fp8"]
    stdout = run_straight_and_split(tmp_path, token_files, capsys, gpu)
    assert "compile_mode=reduce-overhead" in stdout
    assert json.loads((tmp_path / "straight" / "result.json").read_text())["compile"] == "reduce-overhead"
    saved = json.loads((tmp_path / "split" / "config.json").read_text())["train"]
    assert saved["compile_mode"] == saved["compile_wrapper"] == "auto"


@pytest.mark.gpu
def test_gpu_auto_fp8_stays_bf16_when_no_layer_pays(tmp_path, token_files, capsys):
    # FP8 not asked for: auto turns it on for FP8 GPUs, but a tiny model has no layer past the shape rule.
    argv = [*TINY, *token_files, "--device", "cuda", "--fp8_shape_filter", "--max_steps", "2", "--out_dir", tmp_path]
    code, stdout, err = run(argv, capsys)
    assert code == 0, err
    assert "use_fp8=False (no layer passes the FP8 filter)" in stdout
    assert json.loads((tmp_path / "result.json").read_text())["precision"] == "bf16"
