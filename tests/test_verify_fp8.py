"""verify_fp8_compilation.py: the CPU (emulated) mode end to end, and the GPU mode on a tiny model."""

import json

import pytest
from tiny import tiny_flags

import verify_fp8_compilation

STEPS = ["--steps", "6"]


def checks_by_name(path):
    payload = json.loads(path.read_text())
    return payload, {c["name"]: c for c in payload["checks"]}


def test_cpu_mode_runs_checks_1_to_4_with_emulation(tmp_path, token_files, capsys):
    out = tmp_path / "verify.json"
    code = verify_fp8_compilation.main([*tiny_flags(), *STEPS, *token_files, "--json", str(out)])
    stdout = capsys.readouterr().out
    assert code == 0, stdout
    payload, checks = checks_by_name(out)
    assert [c["status"] for c in payload["checks"]] == ["PASS", "PASS", "PASS", "PASS", "SKIP"]
    assert checks["fp8_linears"]["evidence"]["counted"] == 14  # 2 x (4 attention + 3 ffn); lm_head skipped
    assert checks["fp8_gemms_launched"]["evidence"]["fp8_casts"] >= 28
    assert "needs a GPU" in checks["fp8_speedup"]["detail"]
    assert [r["precision"] for r in payload["runs"]] == ["bf16", "fp8-tensorwise-emulated"]
    assert "ALL CHECKS PASSED" in stdout


def test_cpu_mode_verifies_the_fused_path_too(tmp_path, token_files, capsys):
    out = tmp_path / "verify.json"
    argv = [*tiny_flags(), *STEPS, *token_files, "--fp8_path", "fused", "--fp8_scaling", "delayed", "--json", str(out)]
    assert verify_fp8_compilation.main(argv) == 0, capsys.readouterr().out
    payload, checks = checks_by_name(out)
    assert [c["status"] for c in payload["checks"]] == ["PASS", "PASS", "PASS", "PASS", "SKIP"]
    assert "fused path, delayed scaling" in checks["fp8_linears"]["detail"]
    assert [r["precision"] for r in payload["runs"]] == ["bf16", "fp8-fused-delayed-emulated"]


def test_a_failing_check_makes_the_exit_code_nonzero(tmp_path, token_files, capsys):
    # A negative tolerance can never be met: the loss check must FAIL and the exit code say so.
    code = verify_fp8_compilation.main([*tiny_flags(), *STEPS, *token_files, "--loss_tolerance", "-1"])
    assert code == 1
    assert "SOME CHECKS FAILED" in capsys.readouterr().out


@pytest.mark.gpu
def test_gpu_mode_sees_real_fp8_gemms(tmp_path, token_files, capsys):
    out = tmp_path / "verify.json"
    # A tiny model is too small for FP8 to pay, so only the speed threshold is relaxed here.
    argv = [
        *tiny_flags("cuda"),
        *STEPS,
        *token_files,
        "--min_speedup",
        "0",
        "--no_fp8_shape_filter",
        "--json",
        str(out),
    ]
    code = verify_fp8_compilation.main(argv)
    assert code == 0, capsys.readouterr().out
    payload, checks = checks_by_name(out)
    assert checks["fp8_gemms_launched"]["evidence"]["scaled_mm"] >= 3 * 14
    assert checks["fp8_speedup"]["status"] == "PASS" and checks["fp8_speedup"]["evidence"]["speedup"] > 0
