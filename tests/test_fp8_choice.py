"""The FP8 path and its settings are chosen in one place (precision/choice.py): the measured-best path by default,
TorchAO's where only it runs, explicit settings kept, and the README saying what the defaults are."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from tiny import TINY_FLAGS

import train_h100
from cs336_basics.build import plan
from cs336_basics.cli import config_from_args, config_parser
from cs336_basics.config import FP8Config
from cs336_basics.config_layers import build_config
from cs336_basics.errors import ConfigError
from cs336_basics.precision.choice import AUTO_SETTINGS, choose_fp8

README = Path(__file__).resolve().parents[1] / "README.md"


def chosen(world_size: int = 1, lora: bool = False, cuda_graphs: bool = False, **fp8) -> FP8Config:
    where = {"world_size": world_size, "lora": lora, "cuda_graphs": cuda_graphs}
    return choose_fp8(FP8Config(**fp8), **where).config


def settings(cfg: FP8Config) -> tuple:
    return tuple(getattr(cfg, name) for name in AUTO_SETTINGS)


def test_the_default_is_the_fused_path_with_the_fp8_head_and_delayed_scaling():
    assert settings(chosen()) == ("fused", True, False, "delayed", False)


@pytest.mark.parametrize(
    "where, fp8, expected",
    [
        # several processes (DDP, FSDP2): the fused path measured fastest there too, with delayed scaling
        ({"world_size": 2}, {}, ("fused", True, False, "delayed", False)),
        ({"world_size": 2, "cuda_graphs": True}, {}, ("fused", True, False, "delayed", False)),
        # TorchAO's path asked for (it has no backward-accumulation setting: None)
        ({"world_size": 2}, {"fp8_path": "torchao"}, ("torchao", False, True, "dynamic", None)),
        ({}, {"fp8_recipe": "rowwise"}, ("torchao", False, True, "dynamic", None)),
        ({}, {"fp8_all_gather": True}, ("torchao", False, True, "dynamic", None)),
        # emulation is TorchAO's, and a speed rule means nothing under it
        ({}, {"fp8_emulate": True}, ("torchao", False, False, "dynamic", None)),
        # a setting only the fused path has picks it, even where TorchAO's would be chosen
        ({}, {"fp8_emulate": True, "fp8_fast_accum_backward": True}, ("fused", True, False, "delayed", True)),
        # explicit settings are kept
        ({}, {"fp8_lm_head": False, "fp8_scaling": "dynamic"}, ("fused", False, False, "dynamic", False)),
        ({}, {"fp8_path": "torchao", "fp8_shape_filter": False}, ("torchao", False, False, "dynamic", None)),
        # a LoRA base runs this package's own FP8 linears whatever the path, with the defaults measured for it:
        # fast accumulation in its backward (input-gradient) GEMMs among them, unless asked otherwise
        ({"lora": True}, {}, ("fused", False, False, "dynamic", True)),
        ({"lora": True, "cuda_graphs": True}, {}, ("fused", True, False, "delayed", True)),
        ({"lora": True}, {"fp8_fast_accum_backward": False}, ("fused", False, False, "dynamic", False)),
        ({"lora": True}, {"fp8_path": "torchao"}, ("torchao", False, False, "dynamic", True)),
        ({"cuda_graphs": True}, {}, ("fused", True, False, "delayed", False)),  # pretraining's do not depend on it
    ],
)
def test_where_the_choice_differs(where, fp8, expected):
    assert settings(chosen(**where, **fp8)) == expected


def test_flags_of_both_paths_together_are_refused():
    with pytest.raises(ConfigError, match="needs the fused FP8 path and --fp8_recipe rowwise TorchAO's"):
        chosen(fp8_scaling="delayed", fp8_recipe="rowwise")


def test_the_plan_resolves_the_choice_and_the_summary_names_it():
    config = build_config({"model": {"dim": 32}, "fp8": {"use_fp8": True, "fp8_emulate": True}}, device_type="cpu")
    p = plan(config)
    assert p.config.fp8.fp8_path == "torchao" and "auto" not in settings(p.config.fp8)
    assert any("fp8_path=torchao (--fp8_emulate is TorchAO's emulation" in note for note in p.auto_choices)


def test_a_run_folder_keeps_the_request_so_a_resume_chooses_again(tmp_path, token_files, capsys):
    out = tmp_path / "run"
    argv = [*TINY_FLAGS, *token_files, "--use_fp8", "--fp8_emulate", "--max_steps", "2", "--out_dir", str(out)]
    assert train_h100.main(argv) == 0
    saved = json.loads((out / "config.json").read_text())["fp8"]
    assert {name: saved[name] for name in AUTO_SETTINGS} == dict(zip(AUTO_SETTINGS, settings(FP8Config()), strict=True))
    result = json.loads((out / "result.json").read_text())
    assert result["fp8_path"] == "torchao" and result["precision"] == "fp8-tensorwise-emulated"


def _readme_defaults() -> dict[str, list[str]]:
    """preset -> the FP8 flags the README's "Default FP8 on one GPU, preset ..." lines give."""
    lines = re.findall(r"^Default FP8 on one GPU, preset (.+?): `(.+)`$", README.read_text(), flags=re.M)
    return {preset.strip(): flags.split() for names, flags in lines for preset in re.split(r",| and ", names) if preset}


def test_the_readme_says_what_the_defaults_are():
    documented = _readme_defaults()
    assert set(documented) == {"366m", "gpt2-small", "1.3b"}
    for preset, flags in documented.items():
        parser = config_parser(None)
        with_flags = config_from_args(parser.parse_args(["--preset", preset, "--device", "cpu", *flags])).fp8
        default = config_from_args(parser.parse_args(["--preset", preset, "--device", "cpu", "--use_fp8"])).fp8
        as_chosen = choose_fp8(default, world_size=1).config
        assert as_chosen == with_flags, preset


def test_settings_of_one_path_are_grouped_under_it_in_help_and_name_it():
    from cs336_basics.cli import config_parser

    help_text = config_parser("x").format_help()
    fused_group = help_text.split("fused FP8 path only")[1].split("TorchAO's FP8 path only")[0]
    assert "--fp8_margin" in fused_group and "--fp8_fast_accum_backward" in fused_group
    assert "--fp8_all_gather" in help_text.split("TorchAO's FP8 path only")[1]
    assert chosen(fp8_margin=1).fp8_path == "fused" and chosen(fp8_all_gather=True).fp8_path == "torchao"
    with pytest.raises(ConfigError, match="--no_fp8_fused_swiglu needs --fp8_path fused"):
        chosen(fp8_path="torchao", fp8_fused_swiglu=False)
    # A switch each path's defaults choose names the fused path only when on: off is what TorchAO's path does (and
    # the saved default of older run folders, which must still resume there).
    assert chosen(fp8_emulate=True, fp8_fast_accum_backward=False).fp8_path == "torchao"
    assert chosen(fp8_emulate=True, fp8_fast_accum_backward=True).fp8_path == "fused"


def test_every_fp8_implementation_is_a_registered_converter_with_its_own_defaults_and_checks():
    from cs336_basics.config import LORA_FP8_PATH
    from cs336_basics.precision.choice import FP8_CONVERTERS

    assert set(FP8_CONVERTERS) == {"fused", "torchao", "accelerate", LORA_FP8_PATH}
    for name, converter in FP8_CONVERTERS.items():
        assert converter.path == name
        whose, defaults = converter.defaults(FP8Config(use_fp8=True), 1, False)
        assert whose and set(defaults) <= set(AUTO_SETTINGS)
    # The LoRA base's checks run where every path's do, on the chosen settings.
    with pytest.raises(ConfigError, match="scales tensorwise"):
        chosen(lora=True, fp8_recipe="rowwise")
