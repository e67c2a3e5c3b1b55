"""The global L2 norm of a list of gradients as one Triton kernel launch per gradient dtype (CUDA).

Each program squares and sums one block of one gradient in fp32 and writes its partial sum; the norm is the square
root of their total. One read of every gradient, vectorized where the tensors allow it (multi_tensor_triton.py), in
place of torch's `_foreach_norm` and the reductions after it, which read the gradients at a fraction of the memory
bandwidth (INDEX.md: 2026-11-26-optimizer-vectors). The partial sums are added in a fixed order,
so the same gradients always give the same norm.

Imported only on CUDA machines: triton ships with torch's Linux CUDA wheels.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from cs336_basics.kernels.multi_tensor import BlockLayout, DeviceInts, addresses, contiguous, vector_aligned
from cs336_basics.kernels.multi_tensor_triton import block_of_tensor, tensor_at

__all__ = ["GradNormLaunch"]

_BLOCK_SIZE = 4096


@triton.jit
def _sum_of_squares_kernel(
    grad_addresses, tensor_of_block, first_block, numel, grad_like, partial_sums,
    ALIGNED: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):  # fmt: skip
    t, offsets, mask = block_of_tensor(tensor_of_block, first_block, numel, ALIGNED, BLOCK_SIZE)
    grad_ptr = tensor_at(grad_addresses, t, grad_like.dtype.element_ty, ALIGNED)
    g = tl.load(grad_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    tl.store(partial_sums + tl.program_id(0), tl.sum(g * g, axis=0))


class GradNormLaunch:
    """clipping.global_grad_norm of a list of gradients (0-d float32 tensor), in one launch per gradient dtype.
    Keeps each dtype's address table and block layout for the next call: keep one per optimizer."""

    def __init__(self) -> None:
        self._launches: dict[torch.dtype, tuple[DeviceInts, BlockLayout]] = {}

    def __call__(self, grads: list[torch.Tensor]) -> torch.Tensor:
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for g in contiguous(grads):
            by_dtype.setdefault(g.dtype, []).append(g)
        partial_sums = []
        for dtype, tensors in by_dtype.items():
            table, layout = self._launches.setdefault(dtype, (DeviceInts(), BlockLayout(_BLOCK_SIZE)))
            grad_addresses, blocks = addresses(table, tensors), layout(tensors)
            sums = torch.empty(blocks.programs, device=tensors[0].device, dtype=torch.float32)
            if blocks.programs:  # none: only empty tensors (a rank's empty shards)
                _sum_of_squares_kernel[(blocks.programs,)](
                    grad_addresses, blocks.tensor_of_block, blocks.first_block, blocks.numel, tensors[0], sums,
                    ALIGNED=vector_aligned(blocks, table), BLOCK_SIZE=_BLOCK_SIZE,
                )  # fmt: skip
            partial_sums.append(sums)
        return torch.cat(partial_sums).sum().sqrt()
