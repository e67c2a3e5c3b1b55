"""Turns the user's "auto" settings into concrete ones for this machine, and refuses impossible requests."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import torch

from cs336_basics.config import (
    RunConfig,
    add_config_arguments,
    build_config,
    load_config_file,
    lookup,
    overrides_from_args,
)
from cs336_basics.errors import ConfigError
from cs336_basics.precision import check_fp8_support

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ConfigError(f"--device {name!r} is not a device name; use auto, cpu, cuda or cuda:N.") from exc
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(
                f"--device {name} was asked for but CUDA is not available here (torch {torch.__version__}, "
                f"built for CUDA {torch.version.cuda}). Install a CUDA build of torch on a GPU machine, "
                "or use --device cpu."
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) are visible.")
    elif device.type != "cpu":
        raise ConfigError(f"--device {name!r} is not supported; use auto, cpu, cuda or cuda:N.")
    return device


def resolve(config: RunConfig) -> tuple[RunConfig, torch.device, list[str]]:
    """Return a copy of `config` with every "auto" made concrete, the device, and a list naming what was
    chosen automatically (for the configuration summary)."""
    t = config.train
    device = resolve_device(t.device)
    auto: list[str] = []
    use_fp8 = config.fp8.use_fp8
    if use_fp8 is None:
        support = check_fp8_support(device)
        use_fp8 = support.ok
        auto.append("use_fp8=True" if use_fp8 else f"use_fp8=False ({support.reason})")
    dtype = t.dtype
    if dtype == "auto":
        # FP8 conversion and the fast tensor-core path want BF16 weights; on CPU float32 is faster and exact.
        dtype = "bfloat16" if device.type == "cuda" or use_fp8 else "float32"
        auto.append(f"dtype={dtype}")
    if dtype not in _DTYPES:
        raise ConfigError(f"--dtype {dtype!r} is not supported; use auto, bfloat16 or float32.")
    compile_model = t.compile_model
    if compile_model is None:
        compile_model = device.type == "cuda"
        auto.append(f"compile_model={compile_model}")
    train = dataclasses.replace(t, device=str(device), dtype=dtype, compile_model=compile_model)
    fp8 = dataclasses.replace(config.fp8, use_fp8=use_fp8)
    return dataclasses.replace(config, train=train, fp8=fp8), device, auto


def torch_dtype(name: str) -> torch.dtype:
    return _DTYPES[name]


def config_parser(description: str | None, prog: str | None = None) -> argparse.ArgumentParser:
    """A script's parser with every config flag (train_h100.py's), so all scripts take the same settings."""
    parser = argparse.ArgumentParser(
        prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_config_arguments(parser)
    return parser


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """CLI > --config file > preset > defaults. With --resume and no --config, the run folder's saved
    config.json is the file layer, so `--resume --out_dir RUN` continues the same run."""
    overrides = overrides_from_args(args)
    from_file = load_config_file(args.config) if args.config else {}
    if lookup("train", "resume", overrides, from_file) and not args.config:
        saved = Path(lookup("train", "out_dir", overrides, from_file)) / "config.json"
        if saved.exists():
            from_file = load_config_file(saved)
    device_type = resolve_device(lookup("train", "device", overrides, from_file)).type
    return build_config(overrides, from_file, device_type)
