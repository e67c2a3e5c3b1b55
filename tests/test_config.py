import argparse
import json

import pytest

from cs336_basics.config import PRESETS, ModelConfig, RunConfig, add_config_arguments, build_config
from cs336_basics.errors import ConfigError
from cs336_basics.runtime import config_from_args, resolve


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    return parser.parse_args(list(argv))


def test_precedence_cli_over_file_over_preset_over_default(tmp_path):
    config_file = tmp_path / "cfg.json"
    config_file.write_text(json.dumps({"preset": "cpu-small", "model": {"dim": 64}, "optim": {"lr": 0.5}}))
    cfg = config_from_args(parse("--config", str(config_file), "--lr", "0.25", "--device", "cpu"))
    assert cfg.optim.lr == 0.25  # CLI beats file
    assert cfg.model.dim == 64  # file beats preset
    assert cfg.model.n_layers == PRESETS["cpu-small"]["model"]["n_layers"]  # preset beats default
    assert cfg.optim.weight_decay == RunConfig().optim.weight_decay  # default


def test_boolean_flags_and_flash_alias():
    cfg = config_from_args(parse("--device", "cpu", "--no_compile_model", "--gradient_checkpointing"))
    assert cfg.train.compile_model is False and cfg.model.gradient_checkpointing is True
    assert config_from_args(parse("--device", "cpu", "--use_flash_attn")).model.attention == "flash"
    cfg = config_from_args(parse("--device", "cpu", "--gradient_checkpointing", "--no_gradient_checkpointing"))
    assert cfg.model.gradient_checkpointing is False


def test_auto_preset_and_resolution_on_cpu():
    cfg, device, auto = resolve(config_from_args(parse("--device", "cpu")))
    assert cfg.preset == "cpu-small" and device.type == "cpu"
    assert cfg.train.dtype == "float32" and cfg.train.compile_model is False
    assert "dtype=float32" in auto and "compile_model=False" in auto
    assert build_config(device_type="cuda").preset == "366m"


def test_config_round_trips_through_dict():
    cfg = build_config({"model": {"n_kv_heads": 2}})
    assert RunConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(dim=100, n_heads=3), "divisible by n_heads"),
        (dict(dim=96, n_heads=6, n_kv_heads=4), "divisible by n_kv_heads"),
        (dict(dim=36, n_heads=4), "odd"),
        (dict(attention="fast"), "attention must be one of"),
    ],
)
def test_bad_model_shapes_are_rejected(fields, message):
    with pytest.raises(ConfigError, match=message):
        ModelConfig(**fields)


def test_unknown_settings_in_file_are_rejected(tmp_path):
    with pytest.raises(ConfigError, match="unknown model settings"):
        build_config(from_file={"model": {"d_model": 4}})
    with pytest.raises(ConfigError, match="unknown preset"):
        build_config({"preset": "huge"})
