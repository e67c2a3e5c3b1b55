"""verify_fp8_compilation.py: the CPU (emulated) mode end to end, a LoRA fine-tune's checks on CPU (its frozen FP8
base runs torch._scaled_mm's CPU kernel), and the GPU mode on a tiny model."""

import json
from pathlib import Path

import pytest
from tiny import TINY_FLAGS, tiny_flags

import train_h100
import verify_fp8_compilation
from cs336_basics.errors import ConfigError
from cs336_basics.lora.layers import FrozenLinear
from cs336_basics.precision.fused.head import LOGITS_ROW_BLOCKS
from cs336_basics.programs import verify_fp8 as verify

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
    # The other FP8 path (the fused one: emulation picks TorchAO's) trained too, side by side.
    precisions = [r["precision"] for r in payload["runs"]]
    assert precisions == ["bf16", "fp8-tensorwise-emulated", "fp8-fused-delayed-emulated"]
    assert [line.split(":")[0] for line in payload["paths"]] == ["torchao", "fused"]
    # A check that did not run is not called passed: the verdict and the report name it.
    assert "EVERY CHECK THAT RAN PASSED; skipped here: fp8_speedup" in stdout and "ALL CHECKS PASSED" not in stdout
    assert payload["passed"] is True and payload["skipped"] == ["fp8_speedup"]
    assert "on the CPU: uncompiled, BF16 weights, FP8 emulated, whatever the flags ask" in stdout
    assert "FP8 paths on this model:" in stdout


def test_cpu_mode_verifies_the_fused_path_too(tmp_path, token_files, capsys):
    out = tmp_path / "verify.json"
    argv = [*tiny_flags(), *STEPS, *token_files, "--fp8_path", "fused", "--fp8_scaling", "delayed", "--json", str(out)]
    assert verify_fp8_compilation.main(argv) == 0, capsys.readouterr().out
    payload, checks = checks_by_name(out)
    assert [c["status"] for c in payload["checks"]] == ["PASS", "PASS", "PASS", "PASS", "SKIP"]
    assert "fused path, delayed scaling" in checks["fp8_linears"]["detail"]
    # TorchAO's path has no delayed scaling: not compared, with the reason, and the verification goes on.
    assert [r["precision"] for r in payload["runs"]] == ["bf16", "fp8-fused-delayed-emulated"]
    assert payload["paths"][1].startswith("not compared: --fp8_path torchao cannot run here: --fp8_scaling delayed")


def test_a_failing_check_makes_the_exit_code_nonzero(tmp_path, token_files, capsys):
    # No tolerance is met only by a loss equal to BF16's to the bit, which FP8's rounding never gives: the loss check
    # must FAIL and the exit code say so.
    argv = [*tiny_flags(), *STEPS, *token_files, "--loss_tolerance", "0", "--no_compare_paths"]
    assert verify_fp8_compilation.main(argv) == 1
    stdout = capsys.readouterr().out
    assert "SOME CHECKS FAILED" in stdout and "the other path" not in stdout  # --no_compare_paths: one FP8 run


def test_help_names_the_verdicts_defaults(capsys):
    with pytest.raises(SystemExit):
        verify_fp8_compilation.main(["--help"])
    said = " ".join(capsys.readouterr().out.split())
    assert "max relative FP8-BF16 loss gap (default 0.02)" in said and "needed to PASS (default 1.0)" in said


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--no_use_fp8"], "does not take --no_use_fp8: it compares FP8 with BF16"),
        (["--resume"], "does not take --resume: it writes no run folder"),
        (["--out_dir", "run"], "does not take --out_dir: it writes no run folder; to keep its results, pass --json"),
        (["--max_steps", "3"], "does not take --max_steps: its steps per precision are --steps"),
        (["--parallel", "ddp"], "runs in one process: drop --parallel"),
        (["--steps", "0"], "--steps must be >= 1; got 0"),
        (["--loss_tolerance", "-1"], "--loss_tolerance and --min_speedup must be finite and >= 0; got -1 and 1"),
        (["--loss_tolerance", "nan"], "--loss_tolerance and --min_speedup must be finite and >= 0; got nan and 1"),
        (["--json", ""], "--json . cannot be used"),
    ],
)
def test_flags_it_cannot_honour_are_refused_before_any_work(flags, says, capsys, monkeypatch):
    monkeypatch.setattr(verify_fp8_compilation, "verify_fp8", lambda *a, **k: pytest.fail("verification started"))
    assert verify_fp8_compilation.main([*tiny_flags(), *flags]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1, err


def test_what_it_cannot_honour_is_refused_in_a_config_file_and_under_torchrun_too(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(verify_fp8_compilation, "verify_fp8", lambda *a, **k: pytest.fail("verification started"))
    for settings, says in (
        ({"train": {"resume": True}}, "does not take {}: its --resume: it writes no run folder"),
        ({"fp8": {"use_fp8": False}}, "does not take {}: its --no_use_fp8: it compares FP8 with BF16"),
        ({"train": {"parallel": "ddp"}}, "runs in one process: drop {}: its --parallel"),
    ):
        path = tmp_path / "c.json"
        path.write_text(json.dumps(settings))
        assert verify_fp8_compilation.main([*tiny_flags(), "--config", str(path)]) == 2
        assert says.format(path) in capsys.readouterr().err
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(name, value)
    assert verify_fp8_compilation.main(tiny_flags()) == 2
    assert "runs in one process: start it without torchrun" in capsys.readouterr().err


def test_trainer_flags_it_leaves_unused_are_named(capsys, monkeypatch):
    def stop(*args, **kwargs):
        raise ConfigError("stopped here")

    monkeypatch.setattr(verify_fp8_compilation, "verify_fp8", stop)
    assert verify_fp8_compilation.main([*tiny_flags(), "--eval_every", "5", "--checkpoint_every", "2"]) == 2
    assert "note: --eval_every, --checkpoint_every not used here" in capsys.readouterr().out


def test_json_never_replaces_a_file_that_is_not_a_report(tmp_path, token_files, capsys, monkeypatch):
    """--json names the report to write: the training data or a config file given there is refused, not replaced."""
    monkeypatch.setattr(verify_fp8_compilation, "verify_fp8", lambda *a, **k: pytest.fail("verification started"))
    data = token_files[1]
    before = Path(data).read_bytes()
    assert verify_fp8_compilation.main([*tiny_flags(), *token_files, "--json", data]) == 2
    assert f"--json {data} cannot be used" in capsys.readouterr().err and Path(data).read_bytes() == before


# ---- a LoRA fine-tune: frozen FP8 base, adapters ----

LORA_CHECKS = [
    "fp8_linears",
    "fp8_gemms_launched",
    "no_base_weight_gradients",
    "base_fp8_weights_cast_once",
    "no_graph_breaks",
    "loss_matches_bf16",
    "fp8_speedup",
]


@pytest.fixture
def lora_flags(tmp_path, token_files, capsys):
    """A tiny base pretrained for a few steps (as in test_lora.py), and the flags of an FP8-base LoRA on it (on CPU the
    frozen base runs real torch._scaled_mm CPU kernels: no emulation)."""
    base = tmp_path / "base"
    assert train_h100.main([*TINY_FLAGS, *token_files, "--max_steps", "2", "--out_dir", str(base)]) == 0
    capsys.readouterr()
    lora = ["--init_from", str(base), "--lora_rank", "4", "--lora_targets", "attn", "--use_fp8"]
    return [*tiny_flags(), "--steps", "4", *token_files, *lora]


@pytest.mark.parametrize("scaling", ["dynamic", "delayed"])
def test_cpu_mode_verifies_a_lora_fine_tune_on_an_fp8_base(scaling, lora_flags, tmp_path, capsys):
    out = tmp_path / "verify.json"
    # The delayed run also puts the head in FP8, which makes its logits in blocks of rows: one GEMM per block.
    delayed = ["--fp8_path", "fused", "--fp8_scaling", "delayed", "--fp8_lm_head"] if scaling == "delayed" else []
    head = scaling == "delayed"
    code = verify_fp8_compilation.main([*lora_flags, *delayed, "--json", str(out)])
    stdout = capsys.readouterr().out
    assert code == 0, stdout
    payload, checks = checks_by_name(out)
    assert [c["name"] for c in payload["checks"]] == LORA_CHECKS
    assert [c["status"] for c in payload["checks"]] == ["PASS"] * 6 + ["SKIP"]
    linears = checks["fp8_linears"]["evidence"]
    n = 15 if head else 14
    assert linears["counted"] == linears["expected"] == n and list(linears["bf16_layers"]) == (
        [] if head else ["lm_head"]
    )
    assert len(linears["adapter_layers"]) == 8 and linears["trainable"] == 2 * 8 * 4 * 32
    # 2 GEMMs per FP8 linear but for the first block's q/k/v, whose input (the frozen embedding) needs no gradient,
    # the second's, whose input gradient is one GEMM for the three, and each block's w1/w3, one for the two; the FP8
    # head's two are one per block of rows each.
    gemms = checks["fp8_gemms_launched"]["evidence"]
    assert gemms["head_blocks"] == (LOGITS_ROW_BLOCKS if head else 0)
    assert gemms["eager_scaled_mm"] == 2 * 14 - 3 - 2 - 2 + (2 * LOGITS_ROW_BLOCKS if head else 0)
    assert checks["base_fp8_weights_cast_once"]["evidence"] == {"layers": n, "recast": {}}
    # The LoRA report's summary comes before the checks: FP8 and BF16 base layers, adapters, no weight gradient.
    summary = stdout.split("training FP8")[0]
    assert f"{n} frozen linears in FP8 (weights cast once), {15 - n} in BF16" in summary
    assert f"inputs and gradients scaled {scaling}" in summary
    assert "adapters on q+k+v+o: 8 layers" in summary and "no weight-gradient GEMM" in summary
    assert "2,048 trainable" in summary and "not emulation" in summary
    assert [r["fp8_path"] for r in payload["runs"]] == [None, "lora-frozen"]
    assert payload["paths"][0].startswith("lora-frozen: loss")  # as the run record names it
    label = "fp8-tensorwise" + ("-delayed" if scaling == "delayed" else "")
    assert [r["precision"] for r in payload["runs"]] == ["bf16", label]  # real FP8, not "-emulated"
    assert "EVERY CHECK THAT RAN PASSED; skipped here: fp8_speedup" in stdout  # speed: on a GPU only


def _recast_a_base_weight(model):
    layer = next(m for m in model.modules() if isinstance(m, FrozenLinear) and m.fp8)
    layer.refresh_fp8_weight()  # as if a step had cast it again


def _train_the_base_head(model):
    model.lm_head.weight.requires_grad_(True)  # the BF16 head (lm_head is not FP8 without --fp8_lm_head)


@pytest.mark.parametrize(
    ("tamper", "failing"),
    [(_recast_a_base_weight, "base_fp8_weights_cast_once"), (_train_the_base_head, "no_base_weight_gradients")],
)
def test_a_lora_check_fails_when_the_frozen_base_breaks_its_promise(
    lora_flags, tmp_path, capsys, monkeypatch, tamper, failing
):
    original = verify.build

    def tampered_build(plan):
        built = original(plan)
        if built.config.fp8.use_fp8:
            tamper(built.model)
        return built

    monkeypatch.setattr(verify, "build", tampered_build)
    out = tmp_path / "verify.json"
    code = verify_fp8_compilation.main([*lora_flags, "--json", str(out)])
    assert code == 1 and "SOME CHECKS FAILED" in capsys.readouterr().out
    _, checks = checks_by_name(out)
    assert [name for name, c in checks.items() if c["status"] == "FAIL"] == [failing]
    if failing == "no_base_weight_gradients":
        assert checks[failing]["evidence"]["base_with_gradients"] == ["lm_head.weight"]
    else:
        assert list(checks[failing]["evidence"]["recast"].values()) == [2]


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
    # Three GEMMs per linear (the two layers' 14 and the head, which the default fused path converts), less those run
    # as one with another's: q/k/v's input gradients (two fewer per layer) and w1/w3's (one).
    gemms = checks["fp8_gemms_launched"]["evidence"]
    assert gemms["scaled_mm"] >= gemms["expected"] == 3 * 15 - 2 * (2 + 1)
    assert checks["fp8_speedup"]["status"] == "PASS" and checks["fp8_speedup"]["evidence"]["speedup"] > 0
    # The default path (fused) and TorchAO's side by side, each with its speed; the Amdahl row of the chosen one.
    assert [line.split(":")[0] for line in payload["paths"]] == ["fused", "torchao"]
    assert all("x BF16" in line for line in payload["paths"]) and len(payload["runs"]) == 3
    assert payload["amdahl"]["n_converted"] == checks["fp8_linears"]["evidence"]["counted"]
    # Timed as the run would be (auto: CUDA graphs for FP8, BF16 without them); check 2 and the profiles came from
    # steps without CUDA graphs, whose ops the profiler sees (the counts above).
    assert [(r["precision"] != "bf16", r["compile"]) for r in payload["runs"]] == [
        (False, "default"),
        (True, "reduce-overhead"),
        (True, "reduce-overhead"),
    ]
    assert payload["amdahl"]["compile"] == "default"


@pytest.mark.gpu
def test_gpu_mode_verifies_a_lora_fine_tune_compiled(tmp_path, token_files, capsys):
    base = tmp_path / "base"
    assert train_h100.main([*TINY_FLAGS, *token_files, "--max_steps", "2", "--out_dir", str(base)]) == 0
    out = tmp_path / "verify.json"
    lora = ["--init_from", str(base), "--lora_rank", "4", "--lora_targets", "attn", "--fp8_lm_head"]
    argv = [*tiny_flags("cuda"), *STEPS, *token_files, *lora, "--min_speedup", "0", "--no_fp8_shape_filter"]
    code = verify_fp8_compilation.main([*argv, "--json", str(out)])
    stdout = capsys.readouterr().out
    assert code == 0, stdout
    payload, checks = checks_by_name(out)
    assert [c["name"] for c in payload["checks"]] == LORA_CHECKS
    gemms = checks["fp8_gemms_launched"]["evidence"]
    # The FP8 head too: one GEMM per block of rows and pass (as in the CPU test above).
    assert gemms["scaled_mm"] == gemms["eager_scaled_mm"] == 2 * 14 - 3 - 2 - 2 + 2 * LOGITS_ROW_BLOCKS
