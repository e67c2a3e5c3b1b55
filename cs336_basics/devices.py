"""--device names (auto, cpu, cuda, cuda:N) as torch devices, refused with what to do where they cannot be used; and
the one check of the measurements that run on a CUDA GPU only."""

from __future__ import annotations

import torch

from cs336_basics.errors import ConfigError, NotSupportedHere


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ConfigError(f"--device {name!r} is not a device name; use auto, cpu, cuda or cuda:N.") from exc
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise NotSupportedHere(
                f"--device {name} was asked for but CUDA is not available here (torch {torch.__version__}, "
                f"built for CUDA {torch.version.cuda}). Install a CUDA build of torch on a GPU machine, "
                "or use --device cpu."
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise NotSupportedHere(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) are visible.")
    elif device.type != "cpu":
        raise ConfigError(f"--device {name!r} is not supported; use auto, cpu, cuda or cuda:N.")
    return device


def require_cuda(what: str, why: str, device: torch.device | str | None = None) -> torch.device:
    """The CUDA device (`device`, default cuda) on which `what`, a measurement of GPU work, runs; a ConfigError that
    says why it needs one where there is none (before any work)."""
    device = torch.device(device) if device is not None else torch.device("cuda")
    if device.type != "cuda" or not torch.cuda.is_available():
        raise ConfigError(
            f"{what} needs a CUDA GPU ({why}); device is {device}, torch.cuda.is_available() is "
            f"{torch.cuda.is_available()}. Run it on a GPU machine."
        )
    return device
