"""The Triton side of multi_tensor.py: which tensor and which elements a program of a multi-tensor launch works on
(CUDA). Shared by every kernel that reads its tensors through tables of addresses.

A pointer read from a table tells the compiler nothing about its alignment, so without a hint every load and store
is one element wide (a 4-byte or 2-byte access per element). When the host has checked that every address and every
size allows it (`multi_tensor.vector_aligned`), `ALIGNED` says so, and the accesses become 16-byte vectors: the
AdamW update reads and writes memory close to the GPU's bandwidth instead of at about half of it
(INDEX.md: 2026-11-26-optimizer-vectors).

Imported only on CUDA machines: triton ships with torch's Linux CUDA wheels.
"""

from __future__ import annotations

import triton
import triton.language as tl

from cs336_basics.kernels.multi_tensor import VECTOR_BYTES

_VECTOR = tl.constexpr(VECTOR_BYTES)


@triton.jit
def block_of_tensor(tensor_of_block, first_block, numel, ALIGNED: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """This program's tensor (its index in the tables), its elements' offsets in that tensor, and their mask."""
    program = tl.program_id(0)
    t = tl.load(tensor_of_block + program)
    n = tl.load(numel + t)
    if ALIGNED:
        n = tl.multiple_of(n, _VECTOR)  # a whole number of vectors: the mask is constant across each
    offsets = (program - tl.load(first_block + t)).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    return t, offsets, offsets < n


@triton.jit
def tensor_at(addresses, t, dtype: tl.constexpr, ALIGNED: tl.constexpr):
    """Tensor `t`'s data pointer from a table of addresses, as a pointer to `dtype`."""
    pointer = tl.load(addresses + t).to(tl.pointer_type(dtype))
    if ALIGNED:
        pointer = tl.multiple_of(pointer, _VECTOR)
    return pointer
