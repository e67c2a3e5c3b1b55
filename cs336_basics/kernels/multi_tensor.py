"""Many tensors in one kernel launch: a Triton kernel reads them through a device table of their addresses, and
runs one program per block of elements of every tensor (the block layout says which tensor each program is in).

Why: a launch costs the host tens of microseconds whatever its size, so a per-tensor loop over a model's hundreds of
parameters or scaling buffers costs milliseconds of host time per step, which a step whose GPU work is short
waits for (INDEX.md: 2026-11-24-host-levers-h100). torch's own multi-tensor ops (`_foreach_*`)
do this for single elementwise ops; the kernels here fuse a whole update into one pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["VECTOR_BYTES", "BlockLayout", "Blocks", "DeviceInts", "addresses", "contiguous", "vector_aligned"]

# A kernel's widest access. Its loads and stores are vectors of this many bytes only where every address is a multiple
# of it and every size a multiple of it in elements, so that no vector straddles a tensor's end
# (multi_tensor_triton.py).
VECTOR_BYTES = 16


class DeviceInts:
    """A list of ints as an int64 tensor on a device, uploaded again only when the list changes: a kernel's table of
    tensor addresses (gradients may be reallocated between steps; the rest stay put) or lengths. Checking costs a
    list comparison; an upload is one small asynchronous copy from pinned memory, never a wait for the GPU."""

    def __init__(self) -> None:
        self._values: list[int] | None = None
        self._table: torch.Tensor | None = None
        self.multiples_of_vector = False  # whether every value is a multiple of VECTOR_BYTES

    def __call__(self, values: list[int], device: torch.device) -> torch.Tensor:
        if values != self._values:
            host = torch.tensor(values, dtype=torch.int64)
            # A kernel already queued may still read the old table: the new one is another allocation, and the
            # caching allocator reuses the old one's memory only in stream order, after that kernel.
            self._table = host.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else host
            self._values = values
            self.multiples_of_vector = all(v % VECTOR_BYTES == 0 for v in values)
        return self._table


def contiguous(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """The tensors as a kernel reads them through their addresses, as flat arrays: each contiguous, copied where it is
    not (keep the list alive until the launch)."""
    return [t if t.is_contiguous() else t.contiguous() for t in tensors]


def addresses(table: DeviceInts, tensors: list[torch.Tensor]) -> torch.Tensor:
    """The tensors' addresses, as a table a kernel reads them through (checked on every call: one `data_ptr()` per
    tensor)."""
    return table([t.data_ptr() for t in tensors], tensors[0].device)


@dataclass(frozen=True)
class Blocks:
    """A launch's programs, one per block of elements of every tensor: each program's tensor (int32), each tensor's
    first program (int32) and size (int64), on the tensors' device; and how many programs there are."""

    tensor_of_block: torch.Tensor
    first_block: torch.Tensor
    numel: torch.Tensor
    programs: int
    whole_vectors: bool  # every size a multiple of VECTOR_BYTES elements


class BlockLayout:
    """The Blocks of `block_size` elements for a list of tensors, built again only when their sizes change."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._numels: list[int] | None = None
        self._blocks: Blocks | None = None

    def __call__(self, tensors: list[torch.Tensor]) -> Blocks:
        numels = [t.numel() for t in tensors]
        if numels != self._numels:
            blocks = torch.tensor([-(-n // self.block_size) for n in numels], dtype=torch.int64)
            device = tensors[0].device
            tensor_of_block = torch.repeat_interleave(torch.arange(len(numels)), blocks).to(torch.int32)
            first_block = (torch.cumsum(blocks, 0) - blocks).to(torch.int32)
            self._blocks = Blocks(
                tensor_of_block.to(device),
                first_block.to(device),
                torch.tensor(numels, device=device),
                int(blocks.sum()),
                all(n % VECTOR_BYTES == 0 for n in numels),
            )
            self._numels = numels
        return self._blocks


def vector_aligned(blocks: Blocks, *tables: DeviceInts) -> bool:
    """Whether a launch over `blocks`, reading its tensors through `tables` (as `addresses` last filled them), may
    access them in vectors of VECTOR_BYTES (the kernels' ALIGNED)."""
    return blocks.whole_vectors and all(table.multiples_of_vector for table in tables)
