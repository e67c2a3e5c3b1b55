"""The loss-parity tool: the comparison rule on synthetic curves, its refusals, and one tiny end-to-end run on CPU
(BF16 against the emulated fused FP8 path) that writes the results and the plot."""

from __future__ import annotations

import json
import subprocess

import pytest
from tiny import TINY_FLAGS

from lab import loss_parity


def Completed(returncode: int) -> subprocess.CompletedProcess:
    return subprocess.CompletedProcess(args=[], returncode=returncode)


def test_every_evaluation_is_compared_with_bf16():
    curves = {"bf16": [(100, 4.0), (200, 3.0)], "fp8": [(100, 4.01), (200, 3.03)]}
    verdicts = loss_parity.compare(curves, tolerance=0.005)
    assert verdicts["bf16"]["max_abs_rel_gap"] == 0 and verdicts["bf16"]["within_tolerance"]
    # 0.25% at step 100 passes, 1% at step 200 does not: one evaluation outside fails the variant.
    assert verdicts["fp8"]["val_rel_gap"][0][1] == pytest.approx(0.0025)
    assert verdicts["fp8"]["max_abs_rel_gap"] == pytest.approx(0.01) and not verdicts["fp8"]["within_tolerance"]
    with pytest.raises(ValueError, match="evaluated at steps"):
        loss_parity.compare({"bf16": curves["bf16"], "fp8": curves["fp8"][:1]}, tolerance=0.005)


def test_seed_spread_runs_are_reported_beside_fp8_not_judged():
    curves = {"bf16": [(100, 4.0), (200, 3.0)], "bf16-seed1": [(100, 4.08), (200, 3.01)],
              "fp8": [(100, 3.99), (200, 3.006)], "fp8-far": [(100, 3.99), (200, 3.012)]}  # fmt: skip
    verdicts = loss_parity.compare(curves, tolerance=0.005, spread=("bf16-seed1",))
    # BF16 parted from itself by 2% at step 100 and 0.33% at 200: fp8's -0.25%, +0.2% are inside, fp8-far's +0.4% not.
    assert verdicts["fp8"]["within_seed_spread"] and not verdicts["fp8-far"]["within_seed_spread"]
    assert "within_seed_spread" not in verdicts["bf16-seed1"] and not verdicts["bf16-seed1"]["within_tolerance"]
    # The spread run, 2% away, fails nothing; a variant outside the tolerance still does.
    assert loss_parity.passed({k: verdicts[k] for k in ("bf16", "bf16-seed1", "fp8")}, spread=("bf16-seed1",))
    assert not loss_parity.passed(verdicts | {"fp8": {"within_tolerance": False}}, spread=("bf16-seed1",))


def test_seed_spread_plans_bf16_runs_of_other_seeds(tmp_path, capsys):
    args = loss_parity.build_parser().parse_args(["--out_dir", str(tmp_path), *TINY_FLAGS, "--seed_spread", "1,2"])
    _, planned, configs = loss_parity.plan_variants(args)
    assert list(planned) == ["bf16", "fp8-fused-dynamic", "bf16-seed1", "bf16-seed2"]
    assert [configs[v].train.seed for v in planned] == [0, 0, 1, 2]
    assert configs["bf16-seed2"].train.out_dir == str(tmp_path / "bf16-seed2")
    assert configs["bf16-seed1"].fp8.use_fp8 is False
    assert loss_parity.main(["--out_dir", str(tmp_path), *TINY_FLAGS, "--seed", "3", "--seed_spread", "3"]) == 2
    assert "--seed_spread 3: that is the compared runs' own seed" in capsys.readouterr().err


def test_settings_each_variant_sets_are_refused(tmp_path, capsys):
    assert loss_parity.main(["--out_dir", str(tmp_path), *TINY_FLAGS, "--use_fp8"]) == 2
    assert "--use_fp8: each variant sets this itself" in capsys.readouterr().err
    assert loss_parity.main(["--out_dir", str(tmp_path), *TINY_FLAGS, "--fp8_lm_head"]) == 2
    assert "--fp8_lm_head: each variant sets this itself" in capsys.readouterr().err


def test_each_variant_trains_under_torchrun_on_several_processes(monkeypatch):
    launched = []
    child = ["-m", "lab.loss_parity", "--run_variant"]
    monkeypatch.setattr(loss_parity.subprocess, "run", lambda command: launched.append(command) or Completed(0))
    assert loss_parity.run_variants({"bf16": {}, "fp8": {}}, nproc=2) == []
    assert all(c[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"] for c in launched)
    assert all(c[5:8] == child for c in launched) and [json.loads(c[-1]) for c in launched] == [{}, {}]
    launched.clear()
    monkeypatch.setattr(loss_parity.subprocess, "run", lambda command: launched.append(command) or Completed(1))
    assert loss_parity.run_variants({"bf16": {}}, nproc=1) == ["bf16"]  # a failed run is named
    assert launched[0][1:4] == child  # one process: no torchrun


@pytest.mark.slow
def test_tiny_bf16_and_fused_fp8_runs_are_compared(tmp_path, token_files):
    out = tmp_path / "parity"
    argv = ["--out_dir", str(out), "--variants", "fp8-fused-dynamic,fp8-fused-dynamic+lm_head", "--tolerance", "0.05",
            *TINY_FLAGS, *token_files, "--fp8_emulate", "--max_steps", "6", "--eval_every", "3", "--eval_batches", "2",
            "--log_every", "3", "--no_compile_model", "--seed_spread", "1"]  # fmt: skip
    assert loss_parity.main(argv) == 0
    data = json.loads((out / "parity.json").read_text())
    variants = ["bf16", "fp8-fused-dynamic", "fp8-fused-dynamic+lm_head", "bf16-seed1"]
    assert data["tolerance"] == 0.05 and [r["variant"] for r in data["runs"]] == variants
    fp8, fp8_head, spread = data["runs"][1:]
    assert spread["val_curve"] != data["runs"][0]["val_curve"] and "within_seed_spread" in fp8
    assert fp8["fp8_path"] == "fused" and fp8["precision"] != data["runs"][0]["precision"]
    assert not fp8["fp8_lm_head"] and fp8_head["fp8_lm_head"] and fp8_head["within_tolerance"]
    assert [step for step, _ in fp8["val_curve"]] == [3, 6] and fp8["within_tolerance"]
    assert (out / "parity.png").stat().st_size > 0 and (out / "bf16" / "metrics.jsonl").is_file()


@pytest.mark.slow
def test_variants_train_on_two_processes_under_torchrun(tmp_path, token_files):
    out = tmp_path / "parity"
    argv = ["--out_dir", str(out), "--variants", "fp8-fused-dynamic", "--tolerance", "0.05", "--nproc_per_node", "2",
            *TINY_FLAGS, *token_files, "--fp8_emulate", "--max_steps", "4", "--eval_every", "2", "--eval_batches", "2",
            "--log_every", "2", "--no_compile_model"]  # fmt: skip
    assert loss_parity.main(argv) == 0
    runs = json.loads((out / "parity.json").read_text())["runs"]
    assert [r["variant"] for r in runs] == ["bf16", "fp8-fused-dynamic"]
    assert all(r["world_size"] == 2 and r["parallel"] == "ddp" for r in runs) and runs[1]["within_tolerance"]
