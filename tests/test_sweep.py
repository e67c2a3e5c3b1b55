"""optimize_performance.py / cs336_basics.sweep: grid and CLI parsing, baseline pairing, failure
classification, and isolated runs end to end (tiny models on CPU; one GPU test)."""

import contextlib
import csv
import json
import math
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny import TINY_FLAGS

import optimize_performance
from cs336_basics import run as train_program
from cs336_basics.config_layers import build_config
from cs336_basics.measure.results import precision_label
from cs336_basics.parallel.world import torchrun_world
from cs336_basics.sweep import cli as sweep_cli
from cs336_basics.sweep import plan as sweep_plan
from cs336_basics.sweep import report as sweep_report
from cs336_basics.sweep import run as sweep_run
from cs336_basics.sweep import worker
from cs336_basics.training.signals import Interrupted

TINY = [flag for flag in TINY_FLAGS if not flag.startswith("--batch_size")]  # the sweep sets the batch itself
TINY_GRID = ["--presets", "cpu-small", "--compile", "eager", "--attention", "sdpa", "--ac", "off", "--batch_sizes", "4"]
TINY_GRID += ["--steps", "4"]
GUIDE_FIELDS = (
    "preset",
    "dim",
    "n_layers",
    "n_heads",
    "d_ff",
    "vocab_size",
    "batch_size",
    "seq_len",
    "precision",
    "compile",
    "attention",
    "tokens_per_sec",
    "mfu",
    "peak_mem_gib",
    "compile_s",
    "loss",
    "status",
    "world_size",
    "parallel",
)


def run_main(argv, capsys):
    code = optimize_performance.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def cli(text):
    return text.split()


def labels(options):
    return [p.point.label for p in sweep_plan.plan_sweep(options)]


# ---- the grid and the command line ----


def test_subset_from_cli_strings():
    options = sweep_cli.parse_options(
        cli(
            "--presets 366m,1.3b --precisions bf16,fp8-tensorwise --compile default --attention sdpa --ac off "
            "--batch_sizes 4,8"
        )
    )
    assert labels(options) == [
        f"{preset}/bs{bs}/{precision}/default/sdpa/ac-off"
        for preset in ("366m", "1.3b")
        for bs in (4, 8)
        for precision in ("bf16", "fp8-tensorwise")
    ]
    assert options.steps == 30 and options.timeout_s == 600


def test_fp8_rows_a_machine_cannot_run_are_known_at_planning_unless_emulated():
    """On the CPU (--device cpu, on any machine) FP8 runs only emulated: the plan says so in the sweep's own flags."""
    flags = "--presets cpu-small --precisions bf16,fp8 --compile default --attention sdpa --ac off --device cpu"
    bf16, fp8 = sweep_plan.plan_sweep(sweep_cli.parse_options(cli(flags)))
    assert bf16.skip is None
    assert fp8.skip.startswith("FP8 does not run here (FP8 needs a CUDA GPU")
    assert fp8.skip.endswith("); drop fp8 from --precisions on this machine")
    emulated = flags.replace("bf16,fp8", "bf16,fp8-tensorwise") + " --fp8_emulate"
    assert [p.skip for p in sweep_plan.plan_sweep(sweep_cli.parse_options(cli(emulated)))] == [None, None]


def test_full_grid_by_default_and_fp8_lm_head_only_multiplies_fp8():
    options = sweep_cli.parse_options([])
    plan = sweep_plan.plan_sweep(options)
    # per preset: (bf16 + 3 FP8 recipes) x 3 compile modes x 2 attention x 2 AC; lm_head on only when asked for
    assert len(plan) == 3 * 48
    assert {p.point.preset for p in plan} == {"366m", "gpt2-small", "1.3b"}
    # without --batch_sizes each preset keeps its own batch size
    assert {(p.point.preset, p.point.batch_size) for p in plan} == {("366m", 8), ("gpt2-small", 16), ("1.3b", 4)}
    assert not any(p.point.fp8_lm_head for p in plan)

    options = sweep_cli.parse_options(
        cli(
            "--presets 1.3b --precisions bf16,fp8-rowwise --fp8_lm_head off,on --compile eager,default "
            "--attention sdpa --ac off,on"
        )
    )
    got = labels(options)
    assert len(got) == (1 + 2) * 2 * 2
    # each (preset, batch, attention, AC) group starts with its BF16 + compile(default) baseline
    assert got[:6] == [
        "1.3b/bs4/bf16/default/sdpa/ac-off",
        "1.3b/bs4/bf16/eager/sdpa/ac-off",
        "1.3b/bs4/fp8-rowwise/eager/sdpa/ac-off",
        "1.3b/bs4/fp8-rowwise+lm_head/eager/sdpa/ac-off",
        "1.3b/bs4/fp8-rowwise/default/sdpa/ac-off",
        "1.3b/bs4/fp8-rowwise+lm_head/default/sdpa/ac-off",
    ]
    assert got[6] == "1.3b/bs4/bf16/default/sdpa/ac-on"


def test_vary_makes_a_grid_axis_of_any_setting_each_value_with_its_own_baseline():
    options = sweep_cli.parse_options(
        cli(
            "--presets 1.3b --precisions bf16,fp8-tensorwise --compile default --attention sdpa --ac off "
            "--world_sizes 2 --parallel fsdp --vary fsdp_reshard_after_forward=on,off --vary ddp_bucket_mb=25,100"
        )
    )
    plan = sweep_plan.plan_sweep(options)
    settings = [f"fsdp_reshard_after_forward={r},ddp_bucket_mb={mb}" for r in ("on", "off") for mb in (25, 100)]
    assert [p.point.label for p in plan] == [
        f"1.3b/bs4/{precision}/default/sdpa/ac-off/fsdp-x2/{setting}"
        for setting in settings
        for precision in ("bf16", "fp8-tensorwise")  # each setting's group: its BF16 baseline first
    ]
    for planned, setting in zip(plan[::2], settings, strict=True):
        reshard, bucket = planned.config.train.fsdp_reshard_after_forward, planned.config.train.ddp_bucket_mb
        assert setting == f"fsdp_reshard_after_forward={'on' if reshard else 'off'},ddp_bucket_mb={bucket}"
        assert planned.spec["extra"]["varied"] == setting  # what the record names
        assert build_config(planned.spec["overrides"]) == planned.config  # what the worker rebuilds
    assert "varied" not in sweep_plan.plan_sweep(sweep_cli.parse_options(cli("--quick")))[0].spec["extra"]

    # Each value pairs with its own BF16 row, and the table shows the setting.
    records = [
        {**rec(tok_s=100.0), "varied": "seed=1"},
        {**rec("fp8-tensorwise", tok_s=130.0), "varied": "seed=1"},
        {**rec(tok_s=200.0), "varied": "seed=2"},
        {**rec("fp8-tensorwise", tok_s=260.0), "varied": "seed=2"},
    ]
    speedups = sweep_report.pair_speedups(records)
    assert speedups == [1.0, 1.3, 1.0, 1.3]
    table = sweep_report.format_table(records, speedups, [None] * 4)
    assert (
        "| # | preset | batch | setting | precision |" in table
        and "| 4 | 366m | 8 | seed=2 | fp8-tensorwise |" in table
    )
    assert "| setting |" not in sweep_report.format_table([rec()], [1.0], [None])  # without --vary: as before


def test_each_point_builds_the_config_it_names():
    options = sweep_cli.parse_options(
        cli(
            "--presets gpt2-small --precisions bf16,fp8-tensorwise,fp8-rowwise,fp8-rowwise_with_gw_hp,fp32 "
            "--fp8_lm_head on --compile eager,max-autotune --attention flash --ac on --batch_sizes 2 --steps 25"
        )
    )
    for planned in sweep_plan.plan_sweep(options):
        point, config = planned.point, planned.config
        assert config == build_config(planned.spec["overrides"])  # what the worker rebuilds
        assert precision_label(config) == point.precision  # the same labels as the results schema
        assert config.fp8.use_fp8 == point.is_fp8
        assert config.fp8.fp8_lm_head == (point.fp8_lm_head if point.is_fp8 else None)  # None: the path's default
        assert config.train.compile_model == (point.compile != "eager")
        if point.compile != "eager":
            assert config.train.compile_mode == point.compile
        assert config.model.attention == "flash" and config.model.gradient_checkpointing
        assert config.train.batch_size == 2 and config.train.max_steps == 25 and config.train.log_every == 5
        assert config.train.eval_every == 0 and config.train.checkpoint_every == 0
        assert config.model.dim == 768  # the preset's shape
    assert [sweep_plan.log_every_for(n) for n in (30, 20, 25, 3, 13)] == [10, 10, 5, 3, 13]


def test_quick_plan_and_dry_run_runs_nothing(tmp_path, capsys, monkeypatch):
    options = sweep_cli.parse_options(["--quick"])
    # compile auto: each side at the mode train_h100.py would give it
    assert labels(options) == ["366m/bs8/bf16/auto/sdpa/ac-off", "366m/bs8/fp8/auto/sdpa/ac-off"]
    assert options.steps == 20 and options.timeout_s == 200  # 2 x 200 s: under 8 minutes even if both hang
    fp8 = sweep_plan.plan_sweep(options)[1].config  # the default FP8: every FP8 setting left to precision/choice.py
    assert fp8.fp8.use_fp8 and fp8.fp8.fp8_path == "auto" and fp8.fp8.fp8_lm_head is None and fp8.train.compile_model
    # explicit flags still override the quick grid
    assert sweep_cli.parse_options(["--quick", "--batch_sizes", "4", "--steps", "10"]).grid.batch_sizes == (4,)

    def must_not_run(*args, **kwargs):
        raise AssertionError("a dry run ran something")

    monkeypatch.setattr(sweep_run, "run_isolated", must_not_run)
    monkeypatch.setattr(sweep_run, "prepare_all_data", must_not_run)
    out = tmp_path / "never"
    code, stdout, _ = run_main(["--quick", "--dry_run", "--out_dir", out], capsys)
    assert code == 0
    assert "sweep plan (--quick): 2 configurations" in stdout
    assert "1. 366m/bs8/bf16/auto/sdpa/ac-off  (baseline)" in stdout
    assert "2. 366m/bs8/fp8/auto/sdpa/ac-off" in stdout
    assert "dry run" in stdout and not out.exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--precisions", "bf16,fp9"], "--precisions: unknown value(s) 'fp9'"),
        (["--presets", "7b"], "--presets: unknown value(s) '7b'"),
        (["--compile", "fast"], "choose from eager, auto, default"),
        (["--attention", ""], "--attention is empty"),
        (["--ac", "maybe"], "--ac: unknown value(s) 'maybe'; choose from off, on"),
        (["--fp8_lm_head", "yes"], "--fp8_lm_head: unknown value(s) 'yes'"),
        (["--batch_sizes", "4,x"], "--batch_sizes must be comma-separated positive integers"),
        (["--batch_sizes", "0"], "--batch_sizes must be comma-separated positive integers"),
        (["--steps", "2"], "--steps must be more than 2"),
        (["--batch_size", "4"], "use --batch_sizes"),
        (["--use_fp8"], "use --precisions"),
        (["--preset", "366m"], "use --presets"),
        (["--compile_mode", "max-autotune"], "use --compile"),
        (["--dim", "30", "--n_heads", "4"], "must be divisible by n_heads"),  # checked for every config up front
        (["--world_sizes", "1,0"], "--world_sizes must be comma-separated positive integers"),
        (["--parallel", "ddp"], "--parallel sets the mode of world sizes above 1"),
        (["--lora_ranks", "8", "--cold"], "--repeats and --cold apply to the throughput sweep"),
        (["--world_sizes", "2", "--parallel", "ddp,zero"], "--parallel: unknown value(s) 'zero'; choose from ddp"),
        (["--vary", "bucket_mb=25,100"], "'bucket_mb' is no train_h100.py setting"),
        (["--vary", "ddp_bucket_mb="], "--vary takes SETTING=VALUE,VALUE"),
        (["--vary", "ddp_bucket_mb=25,big"], "--vary ddp_bucket_mb: 'big' is not a int"),
        (["--vary", "fsdp_reshard_after_forward=yes"], "a switch takes on or off, got 'yes'"),
        (["--vary", "batch_size=4,8"], "--batch_size is set per configuration by the sweep; use --batch_sizes"),
        (["--vary", "fp8_format=e4m3,e9"], "--vary fp8_format: must be one of auto, e4m3, hybrid; got 'e9'"),
        (["--vary", "seed=1", "--vary", "seed=2"], "--vary seed is given twice"),
        (["--seed", "1", "--vary", "seed=1,2"], "--seed is given for every configuration and as --vary seed=1,2"),
        (["--vary", "ddp_bucket_mb=0"], "ddp_bucket_mb"),  # the setting's own check, for every configuration up front
        (["--timeout_s", "nan"], "--timeout_s must be a positive number of seconds, got nan"),  # NaN: no limit at all
        (["--device", "tpu"], "--device 'tpu' is not a device name"),  # not only in each worker's row
        (["--amdahl", "--precisions", "bf16,fp32"], "--amdahl analyses an FP8 configuration compiled in one process"),
        (["--lora_ranks", "8", "--vary", "seed=1,2"], "drop --precisions, --world_sizes, --parallel, --vary"),
        # what the ranks would refuse is refused before anything runs, naming the configuration
        (
            ["--world_sizes", "2", "--parallel", "fsdp", "--precisions", "bf16,fp8-fused-dynamic", "--fp8_all_gather"],
            "fp8-fused-dynamic/eager/sdpa/ac-off/fsdp-x2: --fp8_all_gather is TorchAO's FP8 all-gather under FSDP2",
        ),
    ],
)
def test_invalid_values_stop_with_a_clear_error(argv, message, capsys):
    code, stdout, err = run_main([*argv, "--dry_run"], capsys)
    assert code == 2
    assert message in err
    assert "sweep plan" not in stdout


def test_a_repeat_count_below_one_is_refused(capsys):
    with pytest.raises(SystemExit) as stop:
        run_main(["--repeats", "0", "--dry_run"], capsys)
    assert (
        stop.value.code == 2 and "--repeats: must be a whole number of at least 1, got '0'" in capsys.readouterr().err
    )


# ---- world sizes: the plan and the torchrun launches ----

BENCHMARK = "--presets 1.3b --precisions bf16,fp8-tensorwise --compile default --attention sdpa --ac off"
BENCHMARK += " --batch_sizes 4"


def test_world_sizes_plan_one_gpu_first_then_each_parallel_mode_under_torchrun(tmp_path, capsys, monkeypatch):
    options = sweep_cli.parse_options(cli(f"{BENCHMARK} --world_sizes 1,2 --parallel ddp,fsdp"))
    plan = sweep_plan.plan_sweep(options)
    assert [p.point.label for p in plan] == [
        f"1.3b/bs4/{precision}/default/sdpa/ac-off{where}"
        for where in ("", "/ddp-x2", "/fsdp-x2")
        for precision in ("bf16", "fp8-tensorwise")
    ]
    for planned in plan:
        point, config = planned.point, planned.config
        assert config == build_config(planned.spec["overrides"])  # what every rank rebuilds
        assert config.train.batch_size == 4  # per GPU, at every world size
        assert config.train.parallel == (point.parallel if point.world_size > 1 else "auto")  # auto: one process
        command = sweep_run.launch_command(planned, tmp_path / "r.json")
        worker_part = sweep_run.worker_command(planned.spec, tmp_path / "r.json")
        if point.world_size == 1:
            assert (point.parallel, command) == ("none", worker_part)
        else:  # torchrun (its module, with this interpreter) starting the same worker module on 2 processes
            torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
            assert command == [*torchrun, *worker_part[1:]]
            assert worker_part[1:3] == ["-m", "cs336_basics.sweep.worker"]
    # The Amdahl analysis profiles one GPU: only the one-process FP8 point.
    assert [t.point.label for t in sweep_plan.amdahl_targets(plan)] == ["1.3b/bs4/fp8-tensorwise/default/sdpa/ac-off"]
    # --parallel defaults to both modes; without --world_sizes nothing changes
    assert len(sweep_plan.plan_sweep(sweep_cli.parse_options(cli(f"{BENCHMARK} --world_sizes 2")))) == 4
    assert {p.point.world_size for p in sweep_plan.plan_sweep(sweep_cli.parse_options(cli(BENCHMARK)))} == {1}

    monkeypatch.setattr(sweep_run, "run_isolated", lambda *a, **k: pytest.fail("a dry run ran something"))
    code, stdout, _ = run_main([*cli(f"{BENCHMARK} --world_sizes 1,2 --parallel fsdp"), "--dry_run"], capsys)
    assert code == 0
    launch = f"$ {sys.executable} -m torch.distributed.run --standalone --nproc_per_node=2 -m "
    launch += "cs336_basics.sweep.worker --spec SPEC --out RECORD.json"
    lines = stdout.splitlines()
    i = lines.index("  3. 1.3b/bs4/bf16/default/sdpa/ac-off/fsdp-x2  (baseline)")
    assert lines[i + 1].strip() == launch and lines[i + 3].strip() == launch
    assert stdout.count("torch.distributed.run") == 2  # the one-GPU points run the worker alone


def rec(precision="bf16", compile="default", batch=8, tok_s=100.0, status="ok", lm_head=False, preset="366m"):
    return {
        "preset": preset,
        "dim": 896,
        "n_layers": 24,
        "n_heads": 14,
        "n_kv_heads": 14,
        "d_ff": 3584,
        "vocab_size": 32000,
        "seq_len": 2048,
        "batch_size": batch,
        "gradient_accumulation_steps": 1,
        "attention": "sdpa",
        "gradient_checkpointing": False,
        "precision": precision,
        "fp8_lm_head": lm_head,
        "fp8_shape_filter": True,
        "compile": compile,
        "tokens_per_sec": tok_s if status == "ok" else None,
        "status": status,
    }


def test_multi_gpu_rows_pair_with_their_own_baseline_and_scale_against_one_gpu():
    one = dict(world_size=1, parallel="none")
    records = [
        {**rec(tok_s=100.0), **one},
        {**rec("fp8-tensorwise", tok_s=110.0), **one},
        {**rec(tok_s=190.0), "world_size": 2, "parallel": "ddp"},
        {**rec("fp8-tensorwise", tok_s=228.0), "world_size": 2, "parallel": "ddp"},
        {**rec("fp8-tensorwise", tok_s=200.0), "world_size": 2, "parallel": "fsdp"},  # no FSDP BF16 row
        {**rec("fp8-tensorwise", batch=4, tok_s=300.0), "world_size": 2, "parallel": "ddp"},  # no batch-4 one GPU row
    ]
    # BF16 baselines per world size and mode: 2-GPU FP8 is compared with 2-GPU BF16, not the one-GPU baseline
    assert sweep_report.pair_speedups(records) == [1.0, 1.1, 1.0, pytest.approx(1.2), None, None]
    assert sweep_report.pair_scalings(records) == [
        None,
        None,
        1.9,
        pytest.approx(228 / 110),
        pytest.approx(200 / 110),
        None,
    ]
    table = sweep_report.format_table(records, sweep_report.pair_speedups(records), sweep_report.pair_scalings(records))
    assert "| # | preset | batch | GPUs | precision |" in table and table.splitlines()[0].endswith("| vs 1 GPU |")
    assert "| 3 | 366m | 8 | 2 ddp | bf16 |" in table and table.splitlines()[4].endswith("| 1.000x | 1.900x |")
    one_gpu_table = sweep_report.format_table(records[:2], [1.0, 1.1], [None, None])  # as before: no GPU columns
    assert "GPUs" not in one_gpu_table and "vs 1 GPU" not in one_gpu_table


def test_speedup_pairs_each_row_with_its_bf16_compiled_baseline():
    records = [
        rec(tok_s=200.0),  # baseline, batch 8
        rec("fp8-tensorwise", tok_s=210.0),
        rec("fp8-tensorwise", lm_head=True, tok_s=220.0),
        rec("bf16", compile=False, tok_s=100.0),  # BF16 eager: also against the compiled baseline
        rec("fp8-rowwise", status="oom"),  # did not run: no speedup
        rec("fp8-tensorwise", batch=4, tok_s=150.0),  # batch 4 has no baseline in the sweep
        rec("fp8-tensorwise", preset="1.3b", tok_s=50.0),  # other preset: no baseline
        rec("fp8-tensorwise", compile="max-autotune", tok_s=230.0),
    ]
    assert sweep_report.pair_speedups(records) == [1.0, 1.05, 1.1, 0.5, None, None, None, 1.15]
    # a failed baseline pairs with nothing
    assert sweep_report.pair_speedups([rec(status="error"), rec("fp8-tensorwise", tok_s=210.0)]) == [None, None]
    # a baseline run again later (latest_runs keeps the later one, in the earlier one's place)
    latest = sweep_report.latest_runs([rec(tok_s=100.0), rec("fp8-tensorwise", tok_s=210.0), rec(tok_s=200.0)])
    assert [r["precision"] for r in latest] == ["bf16", "fp8-tensorwise"]
    assert sweep_report.pair_speedups(latest) == [1.0, 1.05]


# ---- failure classification (pure) ----


def test_failure_classifier():
    oom_text = "Traceback ...\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 ..."
    status, message = worker.classify_failure(oom_text, 1)
    assert status == "oom" and message.startswith("torch.OutOfMemoryError: CUDA out of memory")
    assert worker.classify_failure("a\nValueError: bad thing\n\n", 1) == ("error", "ValueError: bad thing")
    assert worker.classify_failure("", 3) == ("error", "no result and no output (exit code 3)")
    status, message = worker.classify_failure("partial output", None, timed_out=True, timeout_s=5)
    assert status == "error" and message.startswith("timeout after 5 s")
    status, message = worker.classify_failure("still compiling", -9)
    assert status == "error" and "killed by SIGKILL" in message and "still compiling" in message

    assert worker.classify_exception(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB"))[0] == "oom"
    try:  # a compiler that wraps the OOM in its own exception is still an OOM
        try:
            raise torch.OutOfMemoryError("CUDA out of memory.")
        except torch.OutOfMemoryError as inner:
            raise RuntimeError("backend compiler failed") from inner
    except RuntimeError as wrapped:
        assert worker.classify_exception(wrapped)[0] == "oom"
    assert worker.classify_exception(ValueError("line one\nline two")) == ("error", "ValueError: line two")


def test_gpu_slug_and_default_out_dir():
    import datetime

    assert sweep_plan.gpu_slug("NVIDIA H100 80GB HBM3") == "h100"
    assert sweep_plan.gpu_slug("NVIDIA H200") == "h200"
    assert sweep_plan.gpu_slug("NVIDIA GeForce RTX 4090") == "nvidia-geforce-rtx-4090"
    assert sweep_plan.gpu_slug(None) == "cpu"
    day = datetime.date(2026, 11, 21)
    assert str(sweep_plan.default_out_dir("NVIDIA H200", day)) == "benchmarks/results/2026-11-21-sweep-h200"


# ---- the worker in-process: skip and error records ----


def test_worker_under_torchrun_rank_0_alone_writes_and_a_failure_exits_1(tmp_path, monkeypatch, capsys):
    """The worker's part of a torchrun launch, one rank at a time in this process: a refusal every rank makes
    (missing data) is recorded with the world it ran on and exits 1, so that torchrun stops the other ranks. The
    process group is left out: without it every collective sees this rank alone, as if the other had agreed."""
    argv = [*TINY_GRID, "--precisions", "fp32", *TINY, "--world_sizes", "2", "--parallel", "ddp"]
    argv += ["--train_data", str(tmp_path / "missing.npy")]
    spec = sweep_plan.plan_sweep(sweep_cli.parse_options(argv))[0].spec
    monkeypatch.setattr(
        train_program, "process_group", lambda device, timeout_s: contextlib.nullcontext(torchrun_world())
    )
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank in (1, 0):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("LOCAL_RANK", str(rank))
        out = tmp_path / "record.json"
        assert worker.main(["--spec", json.dumps(spec), "--out", str(out)]) == 1
        assert out.exists() == (rank == 0)  # rank 0 alone writes the record
        assert f"[rank{rank}]: worker: status error: ConfigError" in capsys.readouterr().out
    record = json.loads(out.read_text())
    assert (record["status"], record["world_size"], record["parallel"]) == ("error", 2, "ddp")
    assert record["label"] == "cpu-small/bs4/fp32/eager/sdpa/ac-off/ddp-x2" and "missing.npy" in record["error"]


def test_worker_skips_what_cannot_run_and_records_an_impossible_config(tmp_path, token_files, capsys):
    flash = sweep_plan.plan_sweep(
        sweep_cli.parse_options([*TINY_GRID, "--attention", "flash", "--precisions", "fp32", *TINY, *token_files])
    )
    record = worker.run_one(flash[0].spec, log=lambda line: None)
    assert record["status"] == "skipped" and "flash attention needs a CUDA GPU" in record["reason"]
    assert record["label"] == "cpu-small/bs4/fp32/eager/flash/ac-off" and record["attention"] == "flash"

    # a context longer than the data passes the machine checks and then fails: an error, with its last line
    long = [*TINY_GRID, "--precisions", "fp32", *TINY, *token_files, "--context_length", "20000"]
    spec = sweep_plan.plan_sweep(sweep_cli.parse_options(long))[0].spec
    out = tmp_path / "record.json"
    assert worker.main(["--spec", json.dumps(spec), "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["status"] == "error"
    assert record["error"].startswith("ConfigError: context_length 20000 is longer than the training data")
    assert record["seq_len"] == 20000 and record["tokens_per_sec"] is None
    assert "worker: status error" in capsys.readouterr().out


# ---- isolated runs end to end ----


@pytest.mark.slow
def test_end_to_end_cpu_sweep_writes_every_output(tmp_path, token_files, capsys):
    out = tmp_path / "sweep"
    argv = [*TINY_GRID, "--precisions", "bf16,fp8-tensorwise", *TINY, *token_files, "--out_dir", out]
    code, stdout, err = run_main(argv, capsys)
    assert code == 0, stdout + err
    assert "sweep plan: 2 configurations" in stdout
    assert "[1/2] cpu-small/bs4/bf16/eager/sdpa/ac-off: ok" in stdout
    assert "peak n/a, compile n/a" in stdout  # a CPU run has neither: n/a, without a unit after it
    assert "| # | preset | batch | precision |" in stdout and "MFU (vs BF16 peak)" in stdout
    assert "TFLOP/s: H100 989, H200 989" in stdout

    data = json.loads((out / "sweep.json").read_text())
    assert {"gpu", "torch", "torchao", "command", "runs"} <= set(data)
    assert len(data["runs"]) == 2
    for run in data["runs"]:
        assert set(GUIDE_FIELDS) <= set(run), set(GUIDE_FIELDS) - set(run)
        assert (run["preset"], run["dim"], run["batch_size"], run["seq_len"]) == ("cpu-small", 32, 4, 16)
        assert run["compile"] is False and run["attention"] == "sdpa"
    bf16, fp8 = data["runs"]
    assert (out / bf16["log"]).exists()
    assert bf16["status"] == "ok" and bf16["precision"] == "bf16"
    assert bf16["tokens_per_sec"] > 0 and bf16["step_time_ms"] > 0 and math.isfinite(bf16["loss"])
    assert bf16["mfu"] is None and bf16["peak_mem_gib"] is None  # CPU: no known peak, no CUDA memory
    assert bf16["steps"] == 4 and bf16["speedup_vs_bf16"] is None  # eager BF16 is not the (compiled) baseline
    assert fp8["status"] == "skipped" and fp8["precision"] == "fp8-tensorwise"
    # Known at planning: said in the sweep's own flags, and no worker started for it (no log).
    assert "FP8 does not run here (FP8 needs a CUDA GPU" in fp8["reason"] and fp8["tokens_per_sec"] is None
    assert "drop fp8 from --precisions on this machine" in fp8["reason"] and "log" not in fp8

    with (out / "sweep.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["status"] for r in rows] == ["ok", "skipped"] and set(GUIDE_FIELDS) <= set(rows[0])
    assert "| 1 | cpu-small | 4 | bf16 |" in (out / "sweep.md").read_text()
    assert (out / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


FAKE_WORKER = textwrap.dedent(
    """
    import json, os, pathlib, shutil, sys, time
    mode, snapshot_from, snapshot_to = sys.argv[1:4]
    out = sys.argv[sys.argv.index("--out") + 1]
    if mode == "fail":  # what the results file holds while the second configuration runs (if anything yet)
        if os.path.exists(snapshot_from):
            shutil.copy(snapshot_from, snapshot_to)
        print("Traceback (most recent call last):")
        print("RuntimeError: simulated crash", file=sys.stderr)
        sys.exit(1)
    if mode == "oom":
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 9.00 GiB", file=sys.stderr)
        sys.exit(1)
    if mode == "sleep":
        pid_file = pathlib.Path(snapshot_to).with_name(f"pid-{os.environ.get('RANK', 0)}")
        pid_file.write_text(str(os.getpid()))
        time.sleep(60)
    caches = [os.environ.get(name) for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TMPDIR")]
    if all(caches):  # --cold: note each cache folder and whether it started empty, then fill it as a compile would
        with open(pathlib.Path(snapshot_to).with_name("caches.txt"), "a") as f:
            for cache in caches:
                f.write(f"{cache} {not os.path.exists(cache) or not os.listdir(cache)}\\n")
                os.makedirs(cache, exist_ok=True)
                pathlib.Path(cache, "compiled").write_text("x")
    if mode == "skip":
        with open(out, "w") as f:
            json.dump({"status": "skipped", "reason": "this machine cannot run it"}, f)
        sys.exit(0)
    tokens = float(mode.split(":")[1]) if ":" in mode else 1000.0
    with open(out, "w") as f:
        json.dump({"status": "ok", "tokens_per_sec": tokens, "step_time_ms": 64.0, "loss": 4.0,
                   "step_ms": [1e6 / tokens], "host_ms": [[1e6 / tokens]]}, f)
    """
)


@pytest.fixture
def fake_workers(tmp_path, monkeypatch):
    """Replace the worker command, config by config: "real" keeps it, the rest run FAKE_WORKER in that mode."""
    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE_WORKER)
    real = sweep_run.worker_command
    modes: list[str] = []

    def command(spec, out_path):  # under torchrun, the launch wraps this command
        mode = modes.pop(0)
        if mode == "real":
            return real(spec, out_path)
        snapshot = (tmp_path / "sweep" / "sweep.json", tmp_path / "snapshot.json")
        return [sys.executable, str(script), mode, *map(str, snapshot), "--out", str(out_path)]

    monkeypatch.setattr(sweep_run, "worker_command", command)
    return modes


@pytest.mark.slow
def test_failed_worker_is_recorded_the_sweep_goes_on_and_results_are_kept(tmp_path, token_files, capsys, fake_workers):
    fake_workers += ["real", "fail", "ok"]
    out = tmp_path / "sweep"
    argv = [*TINY_GRID, "--precisions", "fp32", "--batch_sizes", "4,8,2", *TINY, *token_files, "--out_dir", out]
    code, stdout, err = run_main(argv, capsys)
    assert code == 1, stdout + err  # an "error" row makes the exit status 1
    # while the second configuration ran, the file already held the first, finished one
    snapshot = json.loads((tmp_path / "snapshot.json").read_text())
    assert [(r["batch_size"], r["status"]) for r in snapshot["runs"]] == [(4, "ok")]
    runs = json.loads((out / "sweep.json").read_text())["runs"]
    assert [(r["batch_size"], r["status"]) for r in runs] == [(4, "ok"), (8, "error"), (2, "ok")]
    assert runs[1]["error"] == "RuntimeError: simulated crash" and runs[1]["precision"] == "fp32"
    assert "[2/3] cpu-small/bs8/fp32/eager/sdpa/ac-off: error: RuntimeError: simulated crash" in stdout
    assert "[3/3]" in stdout and (out / "sweep.png").exists()


def test_timeout_and_crashed_oom_are_classified(tmp_path, token_files, capsys, fake_workers):
    fake_workers += ["sleep", "oom", "ok"]
    out = tmp_path / "sweep"
    argv = [*TINY_GRID, "--precisions", "fp32", "--batch_sizes", "1,2,3", *TINY, *token_files, "--timeout_s", "3"]
    code, stdout, _ = run_main([*argv, "--out_dir", out], capsys)
    assert code == 1
    runs = json.loads((out / "sweep.json").read_text())["runs"]
    assert [r["status"] for r in runs] == ["error", "oom", "ok"]
    assert runs[0]["error"].startswith("timeout after 3 s")
    assert runs[1]["error"].startswith("torch.OutOfMemoryError: CUDA out of memory")
    assert runs[2]["tokens_per_sec"] == 1000.0 and runs[2]["dim"] == 32  # the planned shape fills the record
    assert "| error: timeout after 3 s" in (out / "sweep.md").read_text()


def test_repeats_report_the_median_run_and_the_range_each_run_with_empty_caches(
    tmp_path, token_files, capsys, fake_workers
):
    # The two configurations take turns (first, second, first, ...): the workers' outcomes in that order.
    fake_workers += ["ok:900", "fail", "ok:1200", "ok:500", "ok:1000", "ok:700"]
    out = tmp_path / "sweep"
    argv = [*TINY_GRID, "--precisions", "fp32", "--batch_sizes", "4,8", *TINY, *token_files, "--repeats", "3"]
    code, stdout, _ = run_main([*argv, "--cold", "--out_dir", out], capsys)
    assert code == 0, stdout  # a failed run among finished ones does not fail its configuration
    first, second = json.loads((out / "sweep.json").read_text())["runs"]
    assert first["tokens_per_sec"] == 1000.0 and first["tokens_per_sec_runs"] == [900.0, 1200.0, 1000.0]
    assert (first["tokens_per_sec_min"], first["tokens_per_sec_max"], first["repeats_ok"]) == (900.0, 1200.0, 3)
    assert first["cold"] and first["logs"][2].endswith(".3.log") and (out / first["logs"][2]).exists()
    # every run's per-step series, in run order, not only the median run's
    assert [run["step_ms"] for run in first["step_series_runs"]] == [[1e6 / 900], [1e6 / 1200], [1e6 / 1000]]
    assert first["step_series_runs"][0]["host_ms"] == [[1e6 / 900]] and first["step_series_runs"][0]["gc_ms"] is None
    # two finished: the lower middle one, so that every field is one real run's
    assert second["tokens_per_sec"] == 500.0 and second["repeats_ok"] == 2 and second["status"] == "ok"
    assert second["repeat_errors"] == ["RuntimeError: simulated crash"]
    report = (out / "sweep.md").read_text()
    assert "1,000 (900–1,200, 3 of 3)" in report and "500 (500–700, 2 of 3)" in report and "eager, cold" in report
    log = stdout.splitlines()
    turns = [line.split(":")[0] for line in log if "running (run" in line]
    assert [t.split()[0] for t in turns] == ["[1/2]", "[2/2]"] * 3  # the configurations took turns
    caches = [line.split() for line in (tmp_path / "caches.txt").read_text().splitlines()]
    # Inductor's, Triton's and the temporary folder (inductor's C++ headers): new folders for every run.
    assert len(caches) == 3 * 5 and len({folder for folder, _ in caches}) == 15
    assert all(empty == "True" for _, empty in caches)
    assert not any(Path(folder).exists() for folder, _ in caches)  # and removed afterwards


def alive(pid: int) -> bool:
    """Running (a zombie, dead but not yet reaped by whoever adopted it, does not count)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


@pytest.mark.slow
def test_a_torchrun_launch_that_times_out_leaves_no_rank_running(tmp_path, token_files, capsys, fake_workers):
    """torchrun starts its ranks in sessions of their own, which killing torchrun's would not reach: the sweep stops
    torchrun with SIGTERM first, and torchrun stops its ranks."""
    fake_workers += ["sleep", "sleep"]  # the printed plan shows the launch command too
    out = tmp_path / "sweep"
    argv = [*TINY_GRID, "--precisions", "fp32", *TINY, *token_files, "--world_sizes", "2", "--parallel", "ddp"]
    # 10 s: torchrun starts the ranks in about 3.5 s on a 2-core machine
    code, stdout, _ = run_main([*argv, "--timeout_s", "10", "--out_dir", out], capsys)
    assert code == 1
    pids = [int((tmp_path / f"pid-{rank}").read_text()) for rank in (0, 1)]  # both ranks had started
    assert not [pid for pid in pids if alive(pid)]
    (run,) = json.loads((out / "sweep.json").read_text())["runs"]
    assert (run["status"], run["world_size"], run["parallel"]) == ("error", 2, "ddp")
    assert run["error"].startswith("timeout after 10 s") and "torch.distributed.run" in (out / run["log"]).read_text()


@pytest.mark.slow
def test_end_to_end_cpu_sweep_over_world_sizes_with_torchrun(tmp_path, token_files, capsys):
    """One process and 2 ranks under torchrun (DDP on gloo): one record each, rank 0's, with the global tokens/s."""
    out = tmp_path / "sweep"
    argv = [*TINY_GRID, "--precisions", "fp32", *TINY, *token_files, "--world_sizes", "1,2", "--parallel", "ddp"]
    code, stdout, err = run_main([*argv, "--out_dir", out], capsys)
    assert code == 0, stdout + err
    one, two = json.loads((out / "sweep.json").read_text())["runs"]
    assert (one["world_size"], one["parallel"], two["world_size"], two["parallel"]) == (1, "none", 2, "ddp")
    for run in (one, two):
        assert run["status"] == "ok" and set(GUIDE_FIELDS) <= set(run) and math.isfinite(run["loss"])
    # tokens/s counts both ranks' batches: the global batch per (median) step time
    assert two["tokens_per_sec"] == pytest.approx(2 * 4 * 16 / (two["step_time_ms"] / 1e3))
    assert two["scaling_vs_1gpu"] == pytest.approx(two["tokens_per_sec"] / one["tokens_per_sec"])
    assert "peak_mem_gib: per GPU, the largest over the ranks" in two["parallel_note"]
    log = (out / two["log"]).read_text()
    assert "--nproc_per_node=2" in log and "ddp, world size 2: --parallel ddp" in log
    assert log.count("worker: status ok") == 2  # both ranks trained
    assert "| 2 | cpu-small | 4 | 2 ddp | fp32 |" in (out / "sweep.md").read_text()


def interrupt_run(monkeypatch, call: int) -> None:
    """Ctrl-C during the sweep's `call`-th run (counted from 1): the runs before it go ahead as usual."""
    real_run = sweep_run.run_isolated
    calls = []

    def run_then_interrupt(*args, **kwargs):
        calls.append(1)
        if len(calls) == call:
            raise KeyboardInterrupt
        return real_run(*args, **kwargs)

    monkeypatch.setattr(sweep_run, "run_isolated", run_then_interrupt)


def test_ctrl_c_keeps_what_finished(tmp_path, token_files, capsys, fake_workers, monkeypatch):
    fake_workers += ["ok"]
    interrupt_run(monkeypatch, call=2)
    out = tmp_path / "sweep"
    argv = [*TINY_GRID, "--precisions", "fp32", "--batch_sizes", "1,2,3", *TINY, *token_files, "--out_dir", out]
    code, _, err = run_main(argv, capsys)
    assert code == 130 and "interrupted" in err
    assert [r["batch_size"] for r in json.loads((out / "sweep.json").read_text())["runs"]] == [1]
    assert (out / "sweep.md").exists() and (out / "sweep.png").exists()


def test_a_sweep_stopped_between_repeats_keeps_the_runs_that_finished(
    tmp_path, token_files, capsys, fake_workers, monkeypatch
):
    # Two configurations taking turns, three runs each; stopped during the fifth run (the second's third is never
    # started): the first keeps two runs, the second two, each marked cut short.
    fake_workers += ["ok:900", "ok:500", "ok:1200", "ok:700"]
    interrupt_run(monkeypatch, call=5)
    out = tmp_path / "sweep"
    argv = [*TINY_GRID, "--precisions", "fp32", "--batch_sizes", "4,8", *TINY, *token_files, "--repeats", "3"]
    code, _, err = run_main([*argv, "--out_dir", out], capsys)
    assert code == 130 and "cut short" in err
    first, second = json.loads((out / "sweep.json").read_text())["runs"]
    assert first["tokens_per_sec_runs"] == [900.0, 1200.0] and second["tokens_per_sec_runs"] == [500.0, 700.0]
    assert first["repeats"] == second["repeats"] == 2 and first["repeats_planned"] == second["repeats_planned"] == 3
    assert first["tokens_per_sec"] == 900.0  # the lower of the middle two: one real run's fields
    assert "900 (900–1,200, 2 of 2; cut short, 3 planned)" in (out / "sweep.md").read_text()


def test_a_stop_signal_gives_its_own_exit_code_and_says_what_finished(
    tmp_path, token_files, capsys, fake_workers, monkeypatch
):
    fake_workers += ["ok"]
    real_run = sweep_run.run_isolated
    calls = []

    def run_then_terminate(*args, **kwargs):  # SIGTERM during the second run, as terminate_raises raises it
        calls.append(1)
        if len(calls) == 2:
            raise Interrupted(signal.SIGTERM)
        return real_run(*args, **kwargs)

    monkeypatch.setattr(sweep_run, "run_isolated", run_then_terminate)
    out = tmp_path / "sweep"
    argv = [*TINY_GRID, "--precisions", "fp32", "--batch_sizes", "1,2", *TINY, *token_files, "--out_dir", out]
    code, _, err = run_main(argv, capsys)
    assert code == 143 and "stopped by SIGTERM. " in err and "hold the configurations that finished" in err
    assert "Traceback" not in err


def test_a_run_that_finished_as_the_sweep_was_stopped_is_kept(tmp_path, token_files, capsys, fake_workers, monkeypatch):
    """Ctrl-C while the worker, its record written, was exiting: the record is read and kept, not thrown away."""
    fake_workers += ["ok:777"]

    def record_written_then_ctrl_c(proc, timeout_s, stop):
        out_path = Path(proc.args[proc.args.index("--out") + 1])
        deadline = time.monotonic() + 60
        while not out_path.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep_run, "_wait", record_written_then_ctrl_c)
    out = tmp_path / "sweep"
    code, _, err = run_main([*TINY_GRID, "--precisions", "fp32", *TINY, *token_files, "--out_dir", out], capsys)
    assert code == 130 and "hold the configurations that finished" in err
    (run,) = json.loads((out / "sweep.json").read_text())["runs"]
    assert (run["status"], run["tokens_per_sec"]) == ("ok", 777.0) and (out / run["log"]).is_file()


def test_a_stop_signal_in_the_amdahl_phase_is_one_line_and_stops_its_process(
    tmp_path, token_files, capsys, fake_workers, monkeypatch
):
    """The analysis runs under the sweep's SIGTERM handling too: the signal raises (the analysis' process, in a
    session of its own, is then killed by run_logged) instead of killing the sweep and orphaning it."""
    fake_workers += ["ok", "ok"]

    def analysis_signalled(planned, out_dir, timeout_s):
        handler = signal.getsignal(signal.SIGTERM)
        assert callable(handler), handler  # not the default, which kills the sweep without a word
        handler(signal.SIGTERM, None)

    monkeypatch.setattr(sweep_run, "run_amdahl", analysis_signalled)
    out = tmp_path / "sweep"
    argv = [*TINY_GRID, "--precisions", "fp32,fp8-tensorwise", "--fp8_emulate", *TINY, *token_files, "--amdahl"]
    code, stdout, err = run_main([*argv, "--compile", "default", "--out_dir", out], capsys)
    assert "then where the time goes (--amdahl), in a process each: cpu-small/bs4/fp8-tensorwise/default" in stdout
    assert code == 143 and "hold every configuration; the Amdahl analysis stopped" in err and "Traceback" not in err
    assert len(json.loads((out / "sweep.json").read_text())["runs"]) == 2


def test_a_sweep_that_measured_nothing_fails(tmp_path, token_files, capsys, fake_workers):
    fake_workers += ["skip", "skip"]
    out = tmp_path / "sweep"
    argv = [*TINY_GRID, "--precisions", "fp32", "--batch_sizes", "1,2", *TINY, *token_files, "--out_dir", out]
    code, stdout, _ = run_main(argv, capsys)
    assert code == 1 and "nothing was measured: every configuration was skipped or failed" in stdout


@pytest.mark.parametrize("content", ['{"runs": [', "{}"], ids=["not_json", "no_runs"])
def test_an_out_dir_whose_sweep_json_is_no_results_file_is_refused_before_any_work(
    tmp_path, token_files, capsys, monkeypatch, content
):
    out = tmp_path / "sweep"
    out.mkdir()
    (out / "sweep.json").write_text(content)
    monkeypatch.setattr(sweep_run, "prepare_all_data", lambda *a, **k: pytest.fail("data prepared"))
    code, _, err = run_main([*TINY_GRID, "--precisions", "fp32", *TINY, *token_files, "--out_dir", out], capsys)
    assert code == 2 and "Traceback" not in err
    assert f"--out_dir's {out / 'sweep.json'} cannot be used" in err and "choose another --out_dir" in err


def test_settings_the_sweep_sets_are_refused_in_a_config_file_as_on_the_command_line(tmp_path, capsys):
    for setting, instead in (({"train": {"batch_size": 4}}, "--batch_sizes"), ({"preset": "1.3b"}, "--presets")):
        path = tmp_path / "config.json"
        path.write_text(json.dumps(setting))
        code, stdout, err = run_main([*TINY_GRID, "--config", path, "--dry_run"], capsys)
        assert code == 2 and f"--config {path}: its " in err and f"use {instead}" in err, err
    path.write_text(json.dumps({"model": {"dim": 64}}))  # one it passes through: shown in the plan
    code, stdout, _ = run_main([*TINY_GRID, "--config", path, "--dry_run"], capsys)
    assert code == 0 and 'settings from the --config file for every configuration: {"model": {"dim": 64}}' in stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_device_or_mode_this_machine_lacks_is_refused_before_any_run(tmp_path, token_files, capsys):
    out = tmp_path / "sweep"
    argv = [*TINY_GRID, "--precisions", "fp32", *TINY, *token_files, "--device", "cuda", "--out_dir", out]
    assert run_main([*argv, "--dry_run"], capsys)[0] == 0  # a plan may be printed anywhere
    code, _, err = run_main(argv, capsys)
    assert code == 2 and "--device cuda was asked for but CUDA is not available here" in err and not out.exists()
    code, _, err = run_main(["--lora_ranks", "8", "--presets", "cpu-small", "--out_dir", out], capsys)
    assert code == 2 and "the LoRA sweep needs a CUDA GPU" in err and not out.exists()


def test_the_worker_trains_in_a_folder_beside_its_record_and_removes_it(tmp_path, monkeypatch):
    """Beside the record, in the sweep's temporary folder, which the sweep removes even where it kills the worker
    before the worker could (at once, in one process): not a folder of its own under /tmp, left behind then."""
    folders = []

    def train(config, log):
        folder = Path(config.train.out_dir)
        folder.mkdir()  # as the run does: a folder that must not be there yet
        folders.append(folder)
        (folder / "result.json").write_text(json.dumps({"tokens_per_sec": None}))

    monkeypatch.setattr(worker, "run_training", train)
    out = tmp_path / "work" / "result-1.json"
    out.parent.mkdir()
    spec = {"overrides": {"preset": "cpu-small", "train": {"max_steps": 2}}}
    assert worker.main(["--spec", json.dumps(spec), "--out", str(out)]) == 0
    assert folders == [out.with_suffix(".run")] and not folders[0].exists()
    assert json.loads(out.read_text())["status"] == "ok"


# ---- GPU ----


@pytest.mark.gpu
def test_gpu_bf16_vs_fp8_sweep_reports_a_speedup(tmp_path, capsys):
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 256, 60000).astype(np.uint16)
    np.save(tmp_path / "train.npy", tokens[:50000])
    np.save(tmp_path / "val.npy", tokens[50000:])
    out = tmp_path / "sweep"
    argv = ["--presets", "366m", "--precisions", "bf16,fp8-tensorwise", "--compile", "default", "--attention", "sdpa"]
    argv += ["--ac", "off", "--batch_sizes", "8", "--steps", "10", "--timeout_s", "500", "--out_dir", out, "--amdahl"]
    # a tiny shape on the 366m preset: its FP8 shape rule would convert nothing at this width, so turn it off
    argv += ["--dim", "256", "--n_layers", "2", "--n_heads", "4", "--intermediate_size", "1024"]
    argv += ["--vocab_size", "256", "--context_length", "128", "--no_fp8_shape_filter", "--device", "cuda"]
    argv += ["--train_data", tmp_path / "train.npy", "--val_data", tmp_path / "val.npy"]
    code, stdout, err = run_main(argv, capsys)
    assert code == 0, stdout + err
    bf16, fp8 = json.loads((out / "sweep.json").read_text())["runs"]
    assert (bf16["status"], fp8["status"]) == ("ok", "ok"), stdout
    assert (bf16["precision"], fp8["precision"]) == ("bf16", "fp8-tensorwise")
    assert bf16["compile"] == fp8["compile"] == "default" and fp8["fp8_shape_filter"] is False
    assert bf16["speedup_vs_bf16"] == 1.0
    assert fp8["speedup_vs_bf16"] == pytest.approx(fp8["tokens_per_sec"] / bf16["tokens_per_sec"])
    for run in (bf16, fp8):
        assert run["tokens_per_sec"] > 0 and run["peak_mem_gib"] > 0 and run["compile_s"] > 0
        assert run["step_time_ms"] > 0 and math.isfinite(run["loss"])
    assert "x |" in (out / "sweep.md").read_text()
    assert "| 366m | 8 | 14/15 |" in (out / "amdahl.md").read_text()  # the Amdahl row was measured


def test_amdahl_targets_and_a_cpu_run_reported_as_skipped(tmp_path, token_files):
    argv = [*TINY_GRID, "--precisions", "bf16,fp8-tensorwise,fp8-rowwise", "--compile", "eager,default", *TINY]
    plan = sweep_plan.plan_sweep(sweep_cli.parse_options([*argv, *token_files]))
    targets = sweep_plan.amdahl_targets(plan)
    # One analysis per preset/batch/attention/AC group, taken from its first FP8 + compiled configuration.
    assert [t.point.label for t in targets] == ["cpu-small/bs4/fp8-tensorwise/default/sdpa/ac-off"]
    row = sweep_run.run_amdahl(targets[0], tmp_path, timeout_s=120)
    assert row["status"] == "skipped" and "CUDA" in row["error"]
    report = sweep_report.format_amdahl([row])
    assert "cpu-small batch 4: skipped" in report


def test_amdahl_report_table_from_json_rows():
    row = dict(
        preset="366m",
        batch_size=8,
        n_converted=48,
        n_linear=169,
        linear_share=0.25,
        matmul_speedup=1.8,
        predicted_speedup=1.125,
        measured_speedup=1.05,
        bf16_step_ms=87.0,
        predicted_fp8_step_ms=77.3,
        measured_fp8_step_ms=82.9,
        cast_overhead_ms=5.6,
        status="ok",
    )
    report = sweep_report.format_amdahl([row])
    assert "| 366m | 8 | 48/169 | 25.0% | 1.80x | 1.125x | 1.050x | 87.00 | 77.30 | 82.90 | +5.60 |" in report


def test_log_file_names_keep_to_letters_digits_dots_and_dashes():
    from cs336_basics.sweep.run import _log_name

    label = "1.3b/bs4/fp8-fused-dynamic+lm_head/default/sdpa/ac-off"
    assert _log_name(label) == "1.3b_bs4_fp8-fused-dynamic_lm_head_default_sdpa_ac-off.log"


@pytest.mark.slow
@pytest.mark.parametrize("module", ["cs336_basics.sweep.worker", "cs336_basics.sweep.lora_analysis"])
def test_a_module_the_sweep_launches_runs_once_under_dash_m(module):
    # The package's face loads its submodules lazily: were the worker imported with the package, runpy would run a
    # second copy as __main__ and warn in every configuration's log.
    proc = subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-m", module, "--help"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
