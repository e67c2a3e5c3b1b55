"""Atomic, exactly-resumable checkpoints that load with `torch.load(weights_only=True)`.

A checkpoint holds everything a resumed run needs to continue bit for bit: model weights (of the uncompiled
module, so keys never depend on torch.compile), optimizer state, step, the run's config, the data sampler's
position, and the python / numpy / torch (CPU and CUDA) RNG states.

Why weights_only-safe: unpickling can run arbitrary code, and a checkpoint is exactly the kind of file people
download and share. So the payload is restricted to plain dicts, lists, tuples, numbers, strings, None and
tensors (numpy's RNG state is converted to Python ints), and loading always uses weights_only=True.
"""

from __future__ import annotations

import os
import random
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from cs336_basics.atomic import atomic_write
from cs336_basics.compiled import plain_name, unwrap
from cs336_basics.errors import ConfigError

__all__ = [
    "CHECKPOINT_FORMAT",
    "CHECKPOINT_NAME",
    "latest_checkpoint",
    "load_checkpoint",
    "load_model_state",
    "model_state",
    "read_checkpoint",
    "restore_checkpoint",
    "save_checkpoint",
]

CHECKPOINT_NAME = "checkpoint.pt"
CHECKPOINT_FORMAT = "cs336_basics.checkpoint/v1"


def model_state(model: nn.Module) -> OrderedDict[str, torch.Tensor]:
    """The plain module's state dict, whatever wraps it (torch.compile, DDP): the keys checkpoints use."""
    # Plain names also cover submodules compiled on their own (e.g. per-block compile).
    return OrderedDict((plain_name(k), v) for k, v in unwrap(model).state_dict().items())


# ---- keeping the payload weights_only-safe ----
def _plain(obj: Any, where: str) -> Any:
    """`obj` made of types torch.load(weights_only=True) accepts; common near-misses are converted.

    Fails at save time, naming the offending entry, rather than writing a file that cannot be loaded.
    """
    if obj is None or isinstance(obj, bool | int | float | str | torch.Tensor | torch.dtype | torch.device):
        return obj
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if isinstance(obj, np.generic):  # numpy scalar -> Python scalar
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, dict):
        return {k: _plain(v, f"{where}.{k}") for k, v in obj.items()}
    if isinstance(obj, tuple | list):
        out = [_plain(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        return tuple(out) if isinstance(obj, tuple) else out
    raise TypeError(
        f"checkpoint entry {where} has type {type(obj).__name__}, which torch.load(weights_only=True) cannot "
        "read back; store it as plain dicts/lists/numbers/strings/tensors."
    )


# ---- RNG ----
def _rng_state() -> dict[str, Any]:
    version, internal, gauss_next = random.getstate()
    name, keys, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    cuda = None
    # Only when CUDA is already in use: querying it would otherwise initialise a CUDA context for nothing.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        cuda = torch.cuda.get_rng_state_all()
    return {
        "python": [version, list(internal), gauss_next],
        "numpy": {
            "name": str(name),
            "keys": [int(k) for k in keys],
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "torch": torch.get_rng_state(),
        "cuda": cuda,
    }


def _set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    npy = state["numpy"]
    np.random.set_state(
        (npy["name"], np.asarray(npy["keys"], dtype=np.uint32), npy["pos"], npy["has_gauss"], npy["cached_gaussian"])
    )
    torch.set_rng_state(state["torch"].cpu())  # set_rng_state wants a CPU ByteTensor whatever map_location was
    cuda = state.get("cuda")
    if cuda and torch.cuda.is_available():
        n = torch.cuda.device_count()
        if len(cuda) != n:
            warnings.warn(
                f"checkpoint has CUDA RNG states for {len(cuda)} device(s), this machine has {n}; "
                f"restoring the first {min(n, len(cuda))}.",
                stacklevel=3,
            )
        for i, s in enumerate(cuda[:n]):
            torch.cuda.set_rng_state(s.cpu(), device=i)


# ---- public API ----
def save_checkpoint(
    path: str | os.PathLike,
    *,
    model: nn.Module,
    optimizer: Any,
    step: int,
    config: dict,
    sampler_state: dict | None = None,
    extra: dict | None = None,
) -> Path:
    """Atomically write a checkpoint to `path` and return it as a Path.

    `model` may be the torch.compile wrapper: the uncompiled module's state is saved either way.
    `optimizer` is anything with state_dict() (MasterWeightAdamW, a torch optimizer) or None.
    """
    path = Path(path)
    payload = {
        "format": CHECKPOINT_FORMAT,
        "torch_version": str(torch.__version__),
        "step": int(step),
        # Tensors stay as they are (torch.save copies device tensors to the file itself). Storage shared
        # between model and optimizer (fp32 weights are their own masters) is written once.
        "model": model_state(model),
        "optimizer": _plain(optimizer.state_dict(), "optimizer") if optimizer is not None else None,
        "config": _plain(config, "config"),
        "sampler_state": _plain(sampler_state, "sampler_state"),
        "extra": _plain(extra, "extra"),
        "rng": _rng_state(),
    }
    atomic_write(path, lambda f: torch.save(payload, f))
    return path


def read_checkpoint(path: str | os.PathLike, map_location: str | torch.device | None = "cpu") -> dict[str, Any]:
    """Read and check a checkpoint written by save_checkpoint, restoring nothing: "step", "config",
    "sampler_state", "extra", "model", "optimizer", "rng", "torch_version", "format"."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(
            f"no checkpoint file at {path}; check the path, or start the run without resuming "
            f"(the trainer writes <out_dir>/{CHECKPOINT_NAME})."
        )
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # torn zip, random bytes, empty file, disallowed pickle content, ...
        msg = str(e).strip()
        if "Weights only load failed" in msg:
            # torch's own text suggests weights_only=False, the wrong advice for a file we did not write.
            detail = "it holds objects other than tensors and plain Python data"
        else:
            detail = f"{type(e).__name__}: {msg.splitlines()[0][:200] if msg else 'no details'}"
        raise ConfigError(
            f"{path} is not a readable checkpoint ({detail}); it may be truncated or corrupt, or was not "
            "written by cs336_basics. Delete it, or point at another checkpoint."
        ) from e
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        found = ckpt.get("format") if isinstance(ckpt, dict) else type(ckpt).__name__
        raise ConfigError(
            f"{path} is not a cs336_basics checkpoint (format {found!r}, expected {CHECKPOINT_FORMAT!r}); "
            "point at a checkpoint written by this package's trainer."
        )
    ckpt["path"] = str(path)
    return ckpt


def restore_checkpoint(
    ckpt: dict[str, Any], *, model: nn.Module | None = None, optimizer: Any = None, restore_rng: bool = True
) -> None:
    """Restore what is passed in from a checkpoint read by read_checkpoint.

    The model is restored first (strictly, into the uncompiled module), then the optimizer: with
    MasterWeightAdamW that order lets the fp32 masters overwrite weights the model may hold in lower precision.
    """
    path = ckpt.get("path", "the checkpoint")
    if model is not None:
        load_model_state(model, ckpt["model"], path)
    if optimizer is not None:
        if ckpt.get("optimizer") is None:
            raise ConfigError(f"{path} holds no optimizer state; it cannot resume training, only initialise a model.")
        optimizer.load_state_dict(ckpt["optimizer"])
    if restore_rng:
        _set_rng_state(ckpt["rng"])


def load_checkpoint(
    path: str | os.PathLike,
    *,
    model: nn.Module | None = None,
    optimizer: Any = None,
    map_location: str | torch.device | None = "cpu",
    restore_rng: bool = True,
) -> dict[str, Any]:
    """read_checkpoint + restore_checkpoint: read `path`, restore what is passed in, return the whole dict."""
    ckpt = read_checkpoint(path, map_location)
    restore_checkpoint(ckpt, model=model, optimizer=optimizer, restore_rng=restore_rng)
    return ckpt


def load_model_state(model: nn.Module, state: dict[str, torch.Tensor], path: str) -> None:
    """Load a checkpoint's model state (plain keys) strictly into `model`, whatever wraps it; a ConfigError says
    which keys or shapes do not fit."""
    module = unwrap(model)
    # Map plain checkpoint keys onto this module's own keys, which carry compile prefixes where submodules were
    # compiled in place.
    own = {plain_name(k): k for k in module.state_dict()}
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        raise ConfigError(
            f"{path} does not fit this model: missing keys {missing[:10] or 'none'}"
            f"{' ...' if len(missing) > 10 else ''}, unexpected keys {unexpected[:10] or 'none'}"
            f"{' ...' if len(unexpected) > 10 else ''}. Build the model with the config stored in the checkpoint."
        )
    try:
        module.load_state_dict({own[k]: v for k, v in state.items()}, strict=True)
    except RuntimeError as e:  # shape mismatches
        raise ConfigError(
            f"{path} does not fit this model: {e}. Build the model with the config stored in the checkpoint."
        ) from e


def latest_checkpoint(out_dir: str | os.PathLike) -> Path | None:
    """The run's checkpoint in `out_dir` (the trainer keeps one, overwritten atomically), or None."""
    path = Path(out_dir) / CHECKPOINT_NAME
    return path if path.is_file() else None
