"""--fp8_path accelerate: Hugging Face Accelerate's FP8 (its TorchAO backend, `Accelerator(mixed_precision="fp8")`)
converting this package's model, so that it is measured beside the other paths. What it converts is Accelerate's own
filter's choice, its forward runs in Accelerate's BF16 autocast, and the settings it does not have are refused.
Skipped without accelerate (the hf extra)."""

from __future__ import annotations

import copy
import json
import sys

import pytest
import torch
from tiny import tiny_flags, tiny_model

pytest.importorskip("accelerate")
ao = pytest.importorskip("accelerate.utils.ao")

import verify_fp8_compilation  # noqa: E402
from cs336_basics.config import FP8Config  # noqa: E402
from cs336_basics.errors import ConfigError  # noqa: E402
from cs336_basics.model import TransformerLM  # noqa: E402
from cs336_basics.precision import choose_fp8  # noqa: E402
from cs336_basics.precision.accelerate import SKIP_FIRST_LAST, AccelerateFP8  # noqa: E402
from cs336_basics.precision.fp8 import float8_linear_names  # noqa: E402
from cs336_basics.sweep.plan import WITH_LM_HEAD, precision_settings  # noqa: E402

EMULATED = FP8Config(use_fp8=True, fp8_path="accelerate", fp8_emulate=True, fp8_lm_head=False, fp8_shape_filter=False)


def tiny_bf16() -> TransformerLM:
    torch.manual_seed(0)
    return TransformerLM(tiny_model()).to(torch.bfloat16)


def test_it_converts_what_accelerates_own_filter_chooses_and_autocasts_the_forward():
    model = tiny_bf16()
    theirs = copy.deepcopy(model)
    ao.convert_model_to_fp8_ao(theirs, config=None)  # Accelerate's function with its default filter
    report = AccelerateFP8(EMULATED).convert(model)
    assert report.converted == float8_linear_names(model) == float8_linear_names(theirs)
    assert set(report.skipped) == {"layers.0.attn.q_proj", "lm_head"}  # the first and last nn.Linear
    assert set(report.skip_category.values()) == {SKIP_FIRST_LAST} and report.path == "accelerate"
    assert "accelerate path" in report.summary_line()
    # Accelerate's native AMP for fp8: a BF16 autocast whose outputs it casts to float32.
    ids = torch.randint(0, 64, (2, 16))
    assert model(ids).dtype == torch.float32 and theirs(ids).dtype == torch.bfloat16


def test_the_settings_it_does_not_have_are_refused_with_the_reason():
    refusals = {
        "--fp8_lm_head: Accelerate's default filter decides": {"fp8_lm_head": True},
        "--fp8_shape_filter: Accelerate's default filter decides": {"fp8_shape_filter": True},
        "--fp8_scaling delayed: not a setting of Accelerate's FP8": {"fp8_scaling": "delayed"},
        "--fp8_all_gather: not a setting of Accelerate's FP8": {"fp8_all_gather": True},
    }
    for message, setting in refusals.items():
        with pytest.raises(ConfigError, match=message):
            choose_fp8(FP8Config(use_fp8=True, fp8_path="accelerate", **setting), world_size=1)
    with pytest.raises(ConfigError, match="accelerate launch"):
        choose_fp8(FP8Config(use_fp8=True, fp8_path="accelerate"), world_size=2)


def test_it_is_chosen_only_by_name_with_its_own_defaults():
    auto = choose_fp8(FP8Config(use_fp8=True), world_size=1)
    assert auto.config.fp8_path == "fused"
    named = choose_fp8(FP8Config(use_fp8=True, fp8_path="accelerate"), world_size=1)
    assert (named.config.fp8_lm_head, named.config.fp8_shape_filter, named.config.fp8_scaling) == (
        False,
        False,
        "dynamic",
    )
    assert named.notes == ("fp8_lm_head=False, fp8_shape_filter=False, fp8_scaling=dynamic (Accelerate's defaults)",)
    assert precision_settings("fp8-accelerate")["fp8"] == {
        "use_fp8": True,
        "fp8_lm_head": False,
        "fp8_path": "accelerate",
        "fp8_recipe": "tensorwise",
    }
    assert "fp8-accelerate+lm_head" not in WITH_LM_HEAD


def test_without_accelerate_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "accelerate", None)  # import accelerate now raises ImportError
    with pytest.raises(ConfigError, match="uv sync --extra hf"):
        AccelerateFP8(EMULATED).convert(tiny_bf16())


def test_verify_checks_the_accelerate_path_on_the_cpu(tmp_path, token_files, capsys):
    out = tmp_path / "verify.json"
    argv = [*tiny_flags(), "--steps", "4", *token_files, "--fp8_path", "accelerate", "--json", str(out)]
    assert verify_fp8_compilation.main(argv) == 0, capsys.readouterr().out
    payload = json.loads(out.read_text())
    assert [c["status"] for c in payload["checks"]] == ["PASS", "PASS", "PASS", "PASS", "SKIP"]
    assert payload["checks"][0]["evidence"]["counted"] == 13  # 15 linears but Accelerate's first and last
    assert payload["runs"][1]["fp8_path"] == "accelerate"
    # Beside it, TorchAO's path: the same conversion but for Accelerate's filter and autocast.
    assert [r["precision"] for r in payload["runs"]] == ["bf16", "fp8-accelerate-emulated", "fp8-tensorwise-emulated"]


@pytest.mark.gpu
def test_on_a_gpu_the_accelerate_path_compiles_and_runs_fp8_gemms(tmp_path, token_files, capsys):
    out = tmp_path / "verify.json"
    argv = [*tiny_flags("cuda"), "--steps", "6", *token_files, "--fp8_path", "accelerate", "--min_speedup", "0",
            "--json", str(out)]  # fmt: skip
    assert verify_fp8_compilation.main(argv) == 0, capsys.readouterr().out
    payload = json.loads(out.read_text())
    checks = {c["name"]: c for c in payload["checks"]}
    assert checks["fp8_gemms_launched"]["evidence"]["scaled_mm"] >= 3 * 13
    assert checks["no_graph_breaks"]["status"] == "PASS"
    # TorchAO's path beside it converts nothing at this width on a GPU (its shape rule): said, and the run goes on.
    assert "not compared: --fp8_path torchao cannot run here" in payload["paths"][1]


def test_an_accelerate_state_set_up_for_another_device_is_refused(monkeypatch):
    """Accelerate keeps one state per process: an Accelerator made earlier for another device would wrap this model's
    forward in that device's autocast."""
    import accelerate

    class EarlierAccelerator:
        device = torch.device("cuda", 0)

        def __init__(self, **kwargs):
            pass

        def prepare(self, model, device_placement):
            pytest.fail("prepared a model for the wrong device")

    monkeypatch.setattr(accelerate, "Accelerator", EarlierAccelerator)
    with pytest.raises(ConfigError, match="set up for cuda:0 and the model is on cpu"):
        AccelerateFP8(EMULATED).convert(tiny_bf16())
