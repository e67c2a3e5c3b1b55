"""Parameters sharded by FSDP2 (DTensors), seen as each rank's plain local tensors, and back.

The optimizer and the checkpoints work on the local shard of every parameter: a plain tensor that shares storage
with the DTensor parameter, so writing it updates the model. These helpers are the one place that knows how.
"""

from __future__ import annotations

import sys

import torch


def _dtensor_class() -> type | None:
    """DTensor, or None if torch.distributed.tensor was never imported (then no tensor can be one, and importing it
    just to ask would slow every single-process start)."""
    module = sys.modules.get("torch.distributed.tensor")
    return module.DTensor if module is not None else None


def is_sharded(tensor: torch.Tensor) -> bool:
    dtensor = _dtensor_class()
    return dtensor is not None and isinstance(tensor, dtensor)


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of `tensor` as a plain tensor sharing its storage: the local shard of a DTensor, the inner
    tensor of a wrapper subclass (torchao wraps FP8 weights for its FP8 all-gather), else the tensor itself."""
    if is_sharded(tensor):
        with torch.no_grad():  # without autograd, to_local() is the local tensor itself, not a differentiable view
            tensor = tensor.to_local()
    if type(tensor) not in (torch.Tensor, torch.nn.Parameter) and hasattr(tensor, "__tensor_flatten__"):
        inner, _ = tensor.__tensor_flatten__()
        if len(inner) == 1:
            return getattr(tensor, inner[0])
    return tensor


def shard_of(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a whole tensor, cut the way the DTensor `like` is sharded (no communication: every rank
    holds `full`)."""
    from torch.distributed.tensor import distribute_tensor

    full = full.to(device=local_tensor(like).device)
    return distribute_tensor(full, like.device_mesh, like.placements, src_data_rank=None).to_local()


def sharded_like(local: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`local` (this rank's shard) as a DTensor laid out like `like`, sharing local's storage."""
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(
        local, like.device_mesh, like.placements, shape=like.shape, stride=like.stride(), run_check=False
    )
