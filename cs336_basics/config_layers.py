"""A run's settings resolved from their layers: the CLI > a --config file > a base model (--init_from fixes the
model's shape; so does --hf_model's config) > the preset > the field defaults. Apart from config.py, which holds the
setting types alone, because the base-model layer reads a checkpoint (lora/base.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from cs336_basics.config import PRESETS, SECTIONS, ModelConfig, RunConfig, check_layer, reads_base
from cs336_basics.errors import ConfigError
from cs336_basics.lora.base import model_settings_from_base, read_base


def auto_preset(device_type: str) -> str:
    """The preset "auto" stands for on a device of this type."""
    return "366m" if device_type == "cuda" else "cpu-small"


def merge_layers(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Nested merge of two config layers; `override` wins."""
    merged = {**base}
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_layers(merged[key], value)
        else:
            merged[key] = value
    return merged


def build_config(
    overrides: dict[str, Any] | None = None, from_file: dict[str, Any] | None = None, device_type: str = "cpu"
) -> RunConfig:
    """Resolve a RunConfig: overrides (CLI) > config file > preset > field defaults.

    `device_type` ("cpu" or "cuda") only chooses the preset when the preset is "auto".
    """
    overrides = check_layer(overrides or {}, "the overrides")
    from_file = check_layer(from_file or {}, "the config file")
    preset = overrides.get("preset") or from_file.get("preset") or "auto"
    resolved_preset = auto_preset(device_type) if preset == "auto" else preset
    if resolved_preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}; choose one of auto, {', '.join(PRESETS)}.")
    values = merge_layers(merge_layers(PRESETS[resolved_preset], from_file), overrides)
    values["preset"] = resolved_preset
    init_from = lookup("finetune", "init_from", overrides, from_file)
    lora_rank = lookup("finetune", "lora_rank", overrides, from_file)
    # The base's weights fix the model's shape: a layer between the preset and the file.
    resume = lookup("train", "resume", overrides, from_file)
    if reads_base(init_from, lora_rank, resume=resume):
        if resume and "init_from" not in overrides.get("finetune", {}) and not Path(init_from).expanduser().exists():
            raise ConfigError(
                f"The base this LoRA run fine-tunes, {init_from} (its --init_from), is no longer there: resume with "
                "--init_from where it is now (its weights are checked against those the run started on)."
            )
        values = _with_base(values, init_from, explicit=merge_layers(from_file, overrides))
    hf_model = lookup("model", "hf_model", overrides, from_file)
    if hf_model is not None:  # so does a Hugging Face model's config
        from cs336_basics.hf.models import model_settings_from_hf

        explicit = merge_layers(from_file, overrides).get("model", {})
        model = {**dataclasses.asdict(ModelConfig()), **values.get("model", {})}
        values = {**values, "model": model_settings_from_hf(hf_model, model, explicit)}
    return RunConfig.from_dict(values)


def _with_base(values: dict[str, Any], init_from: str, explicit: dict[str, Any]) -> dict[str, Any]:
    """values with the shape of the base model --init_from names (and, for .txt data, its run's tokenizer)."""
    base = read_base(init_from).whole()
    model = {**dataclasses.asdict(ModelConfig()), **values.get("model", {})}
    values = {**values, "model": model_settings_from_base(base, model, explicit.get("model", {}))}
    data = values.get("data", {})
    text = str(data.get("train_data", "")).lower().endswith(".txt")
    if text and data.get("tokenizer") is None:
        if base.tokenizer is None:  # a new BPE's ids would name other tokens than the base learned
            raise ConfigError(
                f"--init_from {init_from} carries no tokenizer (a state dict), so .txt data would be tokenised by a "
                "new BPE whose ids mean other tokens than the base learned: pass --tokenizer (the base run's "
                "tokenizer/ folder), or token arrays made with it."
            )
        values["data"] = {**data, "tokenizer": str(base.tokenizer)}
    return values


def lookup(section: str, name: str, *layers: dict[str, Any]) -> Any:
    """The first value set for section.name among layers (highest priority first), else the field default."""
    for layer in layers:
        if name in layer.get(section, {}):
            return layer[section][name]
    return next(f.default for f in dataclasses.fields(SECTIONS[section]) if f.name == name)
