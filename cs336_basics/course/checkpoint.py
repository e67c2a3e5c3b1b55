"""The course's checkpoint functions: ``torch.save`` of ``{"model", "optimizer", "iteration"}``.

That layout is the course's, so a checkpoint written by the course's ``save_checkpoint`` loads here and one
written here loads there. Unlike the trainer's checkpoints (``cs336_basics.training.checkpoint``: config, RNG
and sampler state, a name of their own), these hold only the two state dicts and the iteration; a trainer
checkpoint is read as well (its ``step`` is the iteration). The model may be wrapped by ``torch.compile``:
the plain module's keys are written and read either way. Files are read with ``weights_only=True``.
"""

from __future__ import annotations

import os
from typing import IO, Any

import torch
from torch import nn

from cs336_basics.files.integrity import save_torch_file, save_with_checksums, verify_zip
from cs336_basics.training.checkpoint import CHECKPOINT_FORMAT, SHARDED_FORMAT, load_model_state, model_state

__all__ = ["load_checkpoint", "save_checkpoint"]

Target = str | os.PathLike | IO[bytes]


def save_checkpoint(model: nn.Module, optimizer: torch.optim.Optimizer, iteration: int, out: Target) -> None:
    """Write the model's and optimizer's state dicts and ``iteration`` to ``out`` (a path or binary file).

    A path is written atomically (a temporary file renamed into place), so it is never half-written.
    """
    payload = {"model": model_state(model), "optimizer": optimizer.state_dict(), "iteration": int(iteration)}
    if isinstance(out, str | os.PathLike):
        save_torch_file(out, payload)
    else:
        save_with_checksums(payload, out)


def load_checkpoint(src: Target, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Restore ``model`` and ``optimizer`` from ``src`` (a path or binary file); return the iteration saved.

    Tensors are loaded to the CPU first and then copied to wherever the model's parameters live.
    """
    name = os.fspath(src) if isinstance(src, str | os.PathLike) else getattr(src, "name", "checkpoint stream")
    if isinstance(src, str | os.PathLike):
        verify_zip(src)  # a damaged file is an error naming it, not silently different weights
    ckpt: Any = torch.load(src, map_location="cpu", weights_only=True)
    if isinstance(ckpt, dict) and ckpt.get("format") == SHARDED_FORMAT:
        raise ValueError(
            f"{name} is a sharded checkpoint (an FSDP2 run's): its tensors are in the run folder's checkpoint.shards/. "
            "Export it to one file first: python -m cs336_basics.programs.export RUN_FOLDER --output FILE."
        )
    if isinstance(ckpt, dict) and ckpt.get("format") == CHECKPOINT_FORMAT:
        ckpt = dict(ckpt, iteration=ckpt["step"])
    missing = [k for k in ("model", "optimizer", "iteration") if not isinstance(ckpt, dict) or k not in ckpt]
    if missing:
        raise ValueError(f"{name} is not a checkpoint of save_checkpoint's layout: it lacks {missing}.")
    load_model_state(model, ckpt["model"], name)
    optimizer.load_state_dict(ckpt["optimizer"])
    return int(ckpt["iteration"])
