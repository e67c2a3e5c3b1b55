"""Restore a checkpoint into a model and its optimizer, whichever layout each has: a whole (one-process or DDP)
checkpoint or a sharded (FSDP2) one, into a whole model or one sharded by FSDP2. Apart from training/checkpoint.py (the
format, saving and reading) so that the file format does not depend on the sharded layout that builds on it."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from cs336_basics.errors import ConfigError
from cs336_basics.parallel.shards import is_sharded
from cs336_basics.training.checkpoint import is_sharded_checkpoint, load_model_state, read_checkpoint, set_rng_state
from cs336_basics.training.sharded_checkpoint import assemble_sharded, restore_sharded_model


def restore_checkpoint(
    ckpt: dict[str, Any], *, model: nn.Module | None = None, optimizer: Any = None, restore_rng: bool = True
) -> None:
    """Restore what is passed in from a checkpoint read by read_checkpoint.

    The model is restored first (strictly, into the uncompiled module), then the optimizer: with
    MasterWeightAdamW that order lets the fp32 masters overwrite weights the model may hold in lower precision.
    Either kind of checkpoint (whole or sharded) restores into either kind of model (whole, or sharded by FSDP2).
    """
    path = ckpt.get("path", "the checkpoint")
    if model is not None and any(is_sharded(p) for p in model.parameters()):
        restore_sharded_model(ckpt, model=model, optimizer=optimizer)
        model = optimizer = None  # restored; the RNG below is restored as for any checkpoint
    elif is_sharded_checkpoint(ckpt) and (model is not None or optimizer is not None):
        ckpt = assemble_sharded(ckpt)
    if model is not None:
        load_model_state(model, ckpt["model"], path)
    if optimizer is not None:
        if ckpt.get("optimizer") is None:
            raise ConfigError(f"{path} holds no optimizer state; it cannot resume training, only initialise a model.")
        optimizer.load_state_dict(ckpt["optimizer"])
    if restore_rng:
        set_rng_state(ckpt["rng"])


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
