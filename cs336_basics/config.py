"""One config tree for the model, data, optimiser and training loop.

Values resolve in one order everywhere: command line > config file (JSON) > preset > field default.
The tree is saved with every checkpoint, so a run can always be reproduced from its output folder.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cs336_basics.errors import ConfigError

ATTENTION_BACKENDS = ("sdpa", "flash", "math")


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 32000
    context_length: int = 2048
    dim: int = 896
    n_layers: int = 24
    n_heads: int = 14
    # Grouped-query attention: None means one K/V head per query head (plain multi-head attention).
    n_kv_heads: int | None = None
    intermediate_size: int = 3584
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    attention: str = "sdpa"
    # Recompute each block's activations in backward: less memory, about a third more compute.
    gradient_checkpointing: bool = False

    def __post_init__(self) -> None:
        self.validate()

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads if self.n_kv_heads is not None else self.n_heads

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def validate(self) -> None:
        for name in ("vocab_size", "context_length", "dim", "n_layers", "n_heads", "intermediate_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be a positive integer, got {getattr(self, name)}.")
        if self.dim % self.n_heads:
            raise ConfigError(
                f"dim ({self.dim}) must be divisible by n_heads ({self.n_heads}); "
                f"pick n_heads from the divisors of {self.dim}."
            )
        if self.kv_heads < 1 or self.n_heads % self.kv_heads:
            raise ConfigError(
                f"n_heads ({self.n_heads}) must be divisible by n_kv_heads ({self.kv_heads}) "
                "for grouped-query attention."
            )
        if self.head_dim % 2:
            raise ConfigError(
                f"head dimension dim/n_heads = {self.dim}/{self.n_heads} = {self.head_dim} is odd; "
                "RoPE rotates pairs of channels, so it must be even."
            )
        if self.attention not in ATTENTION_BACKENDS:
            raise ConfigError(f"attention must be one of {ATTENTION_BACKENDS}, got {self.attention!r}.")


@dataclass(frozen=True)
class DataConfig:
    # Built-in corpora: "stdlib" (the Python standard library's source, offline) or "tinystories" (downloaded).
    dataset: str = "stdlib"
    # Your own data: raw .txt (tokenised with a BPE trained on it, cached) or token arrays (.npy / .bin).
    train_data: str | None = None
    val_data: str | None = None
    # Where tokenisers and encoded arrays are cached; None means $CS336_CACHE_DIR or ~/.cache/cs336_basics.
    cache_dir: str | None = None


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 3e-4
    min_lr: float = 3e-5
    warmup_steps: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    max_grad_norm: float = 1.0


FP8_RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")
FP8_FORMATS = ("auto", "e4m3", "hybrid")


@dataclass(frozen=True)
class FP8Config:
    # Field names carry the fp8_ prefix because every config field is also a flat CLI flag.
    # None means auto: on where the GPU runs FP8 matmuls (sm_89+, torchao present), off elsewhere.
    use_fp8: bool | None = None
    fp8_recipe: str = "tensorwise"
    # "hybrid": E4M3 forward, E5M2 gradients (wider range for gradients); "e4m3": E4M3 everywhere;
    # "auto": what torchao's recipe uses (hybrid for tensorwise, e4m3 for the rowwise recipes).
    fp8_format: str = "auto"
    # Convert the output projection too (it is the largest matmul, but logits are the most precision-sensitive).
    fp8_lm_head: bool = False
    # Convert only layers whose matmul shape is large enough for FP8 to pay (see cs336_basics/precision).
    fp8_shape_filter: bool = False
    # torchao's emulation: FP8 numerics in high precision, for CPU tests and debugging only (slow).
    fp8_emulate: bool = False

    def __post_init__(self) -> None:
        if self.fp8_recipe not in FP8_RECIPES:
            raise ConfigError(f"fp8_recipe must be one of {FP8_RECIPES}, got {self.fp8_recipe!r}.")
        if self.fp8_format not in FP8_FORMATS:
            raise ConfigError(f"fp8_format must be one of {FP8_FORMATS}, got {self.fp8_format!r}.")


@dataclass(frozen=True)
class TrainConfig:
    batch_size: int = 8
    gradient_accumulation_steps: int = 1
    max_steps: int = 1000
    # "auto" picks cuda when present, else cpu. Asking for cuda on a machine without it is an error.
    device: str = "auto"
    # "auto": bfloat16 weights on CUDA (what FP8 conversion needs), float32 on CPU.
    dtype: str = "auto"
    # None means auto: compile on CUDA (eager leaves most of the speed on the table), eager on CPU.
    compile_model: bool | None = None
    compile_mode: str = "default"
    seed: int = 0
    out_dir: str = "runs/default"
    resume: bool = False
    log_every: int = 10
    eval_every: int = 200
    eval_batches: int = 8
    # Also written at the end and on Ctrl-C; 0 writes none (benchmarks).
    checkpoint_every: int = 500


@dataclass(frozen=True)
class RunConfig:
    # A named model/batch shape (see PRESETS); "auto" picks by device. Explicit fields override it.
    preset: str = "auto"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    fp8: FP8Config = field(default_factory=FP8Config)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RunConfig:
        return _build(values)


# Shapes we benchmark and recommend. "cpu-small" learns visibly in about two minutes on two cores.
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "cpu-small": {
        "model": dict(dim=128, n_layers=4, n_heads=4, intermediate_size=384, vocab_size=2048, context_length=128),
        "train": dict(batch_size=16, max_steps=400, log_every=20, eval_every=100, checkpoint_every=200),
        "optim": dict(lr=2e-3, min_lr=2e-4, warmup_steps=40),
    },
    "366m": {
        "model": dict(dim=896, n_layers=24, n_heads=14, intermediate_size=3584, vocab_size=32000, context_length=2048),
        "train": dict(batch_size=8),
        # Measured on an H200 (benchmarks/results/2026-11-21-fp8-variants-366m-h200.json): converting only the
        # layers that pass the shape rule (w1, w3) gives 1.048x over BF16; converting all 168 gives 1.02x.
        "fp8": dict(fp8_shape_filter=True),
    },
    "gpt2-small": {
        "model": dict(dim=768, n_layers=12, n_heads=12, intermediate_size=3072, vocab_size=50304, context_length=1024),
        "train": dict(batch_size=16),
    },
    "1.3b": {
        "model": dict(dim=2048, n_layers=22, n_heads=16, intermediate_size=5632, vocab_size=32000, context_length=2048),
        "train": dict(batch_size=4),
    },
}
SECTIONS = {"model": ModelConfig, "data": DataConfig, "optim": OptimConfig, "train": TrainConfig, "fp8": FP8Config}


def merge_layers(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Nested merge of two config layers; `override` wins."""
    merged = {**base}
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_layers(merged[key], value)
        else:
            merged[key] = value
    return merged


def _build(values: dict[str, Any]) -> RunConfig:
    unknown = set(values) - set(SECTIONS) - {"preset"}
    if unknown:
        raise ConfigError(f"unknown config sections {sorted(unknown)}; expected preset, {', '.join(SECTIONS)}.")
    sections = {}
    for name, cls in SECTIONS.items():
        given = values.get(name, {})
        known = {f.name for f in dataclasses.fields(cls)}
        bad = set(given) - known
        if bad:
            raise ConfigError(f"unknown {name} settings {sorted(bad)}; valid ones: {sorted(known)}.")
        sections[name] = cls(**given)
    return RunConfig(preset=values.get("preset", "auto"), **sections)


def load_config_file(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid JSON: {exc}") from exc


def build_config(
    overrides: dict[str, Any] | None = None, from_file: dict[str, Any] | None = None, device_type: str = "cpu"
) -> RunConfig:
    """Resolve a RunConfig: overrides (CLI) > config file > preset > field defaults.

    `device_type` ("cpu" or "cuda") only chooses the preset when the preset is "auto".
    """
    overrides, from_file = overrides or {}, from_file or {}
    preset = overrides.get("preset") or from_file.get("preset") or "auto"
    resolved_preset = ("366m" if device_type == "cuda" else "cpu-small") if preset == "auto" else preset
    if resolved_preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}; choose one of auto, {', '.join(PRESETS)}.")
    values = merge_layers(merge_layers(PRESETS[resolved_preset], from_file), overrides)
    values["preset"] = resolved_preset
    return _build(values)


def lookup(section: str, name: str, *layers: dict[str, Any]) -> Any:
    """The first value set for section.name among layers (highest priority first), else the field default."""
    for layer in layers:
        if name in layer.get(section, {}):
            return layer[section][name]
    return next(f.default for f in dataclasses.fields(SECTIONS[section]) if f.name == name)


# ---- command line: one flat flag per config field (flag names match the course's train script) ----

_FLAG_HELP = {
    "dim": "model width d_model",
    "intermediate_size": "SwiGLU hidden size d_ff",
    "n_kv_heads": "key/value heads for grouped-query attention (default: n_heads)",
    "attention": "attention kernel: sdpa (default), flash, or math (reference)",
    "dataset": "built-in corpus: stdlib (offline, default) or tinystories (downloads)",
    "train_data": "training data: .txt (tokenised and cached) or token array .npy/.bin",
    "val_data": "validation data, same formats (default: hold out the last 5%% of train)",
    "device": "auto, cpu, cuda or cuda:N",
    "dtype": "weight dtype: auto (bfloat16 on CUDA, float32 on CPU), bfloat16 or float32",
    "compile_model": "torch.compile the model (default: on for CUDA, off for CPU)",
    "resume": "continue from out_dir/checkpoint.pt exactly where it stopped",
}


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """Add --<field> for every config field, plus --no_<field> for booleans. Defaults stay unset so that
    only flags the user typed override the file and preset."""
    parser.add_argument("--config", help="JSON config file (same layout as config.json in a run folder)")
    parser.add_argument("--preset", choices=["auto", *PRESETS], help="named model/batch shape (default: auto)")
    parser.add_argument(
        "--use_flash_attn", action="store_const", const="flash", dest="attention", help="same as --attention flash"
    )
    for section, cls in SECTIONS.items():
        group = parser.add_argument_group(f"{section} settings")
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            dest = f"{section}.{f.name}"
            kind = hints[f.name]
            help_text = _FLAG_HELP.get(f.name, "") + f" (default {f.default})"
            if kind is bool or kind == (bool | None):
                group.add_argument(f"--{f.name}", action="store_true", default=None, dest=dest, help=help_text)
                group.add_argument(f"--no_{f.name}", action="store_false", default=None, dest=dest)
            else:
                scalar = next(t for t in typing.get_args(kind) or (kind,) if t is not type(None))
                group.add_argument(
                    f"--{f.name}", type=scalar, default=None, dest=dest, metavar=f.name.upper(), help=help_text
                )


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    for key, value in vars(args).items():
        if value is None:
            continue
        if key == "attention":  # set by --use_flash_attn
            overrides.setdefault("model", {})["attention"] = value
        elif key == "preset":
            overrides["preset"] = value
        elif "." in key:
            section, name = key.split(".", 1)
            overrides.setdefault(section, {})[name] = value
    return overrides
