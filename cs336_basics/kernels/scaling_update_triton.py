"""Delayed scaling's once-per-step update (DelayedScalingState.update) as one Triton kernel launch (CUDA).

The update touches a few small buffers of every FP8 linear: three amax recordings each, their history rows, their
scales and inverses. Op by op it is a dozen multi-tensor launches over some hundreds of tensors, and building
those tensor lists costs the host milliseconds per step, which a short FP8 step waits for
(INDEX.md: 2026-11-24-host-levers-h100). Here one program per (linear, role) reads its recording
through a table of addresses (multi_tensor.py), files its amax in the history, zeroes the recording and writes the
new scale and its inverse: the same arithmetic as the op-by-op update, which the tests compare it with bit for bit.
On several ranks the update is two launches of the same kernel around the reduction of the step's amaxes (one small
vector, one collective): the first only reduces the recordings into that vector, the second does the rest from it.

Imported only on CUDA machines (or under Triton's interpreter, in the tests): triton ships with torch's Linux CUDA
wheels.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from cs336_basics.kernels.multi_tensor import DeviceInts, addresses

__all__ = ["ScaleUpdateLaunch"]

_ROW_BLOCK = 1024


@triton.jit(do_not_specialize=["cursor"])
def _scale_update_kernel(
    amax_addresses,
    amax_lengths,
    staged,  # (linears * 3,) float32: this step's amaxes between the two launches of a cross-rank update
    history,  # (linears * 3, history_len) float32, row-major
    scale_addresses,  # each linear's scale, (3,) float32
    scale_inv_addresses,  # each role's inverse, () float32
    limits,  # (3,) the FP8 max of each role's format
    cursor,
    history_len,
    margin_factor,
    MOST_RECENT: tl.constexpr,
    STAGE: tl.constexpr,  # 0: the whole update; 1: only reduce the recordings into `staged`; 2: the rest, from it
    ROW_BLOCK: tl.constexpr,
    HISTORY_BLOCK: tl.constexpr,
):
    row = tl.program_id(0)  # linear * 3 + role
    role = row % 3
    if STAGE == 2:
        amax = tl.load(staged + row)
    else:
        recording = tl.load(amax_addresses + row).to(tl.pointer_type(tl.float32))
        length = tl.load(amax_lengths + row)
        running = tl.zeros([ROW_BLOCK], dtype=tl.float32)
        nan_seen = tl.zeros([ROW_BLOCK], dtype=tl.int32)
        for start in range(0, length, ROW_BLOCK):
            offsets = start + tl.arange(0, ROW_BLOCK)
            mask = offsets < length
            values = tl.load(recording + offsets, mask=mask, other=0.0)
            running = tl.maximum(running, values)
            nan_seen = tl.maximum(nan_seen, (values != values).to(tl.int32))  # torch's max propagates NaN
            tl.store(recording + offsets, tl.zeros([ROW_BLOCK], dtype=tl.float32), mask=mask)
        amax = tl.where(tl.max(nan_seen, 0) > 0, float("nan"), tl.max(running, 0))
    if STAGE == 1:
        tl.store(staged + row, amax)
    else:
        history_row = history + row * history_len
        tl.store(history_row + cursor, amax)
        if MOST_RECENT:
            chosen = amax
        else:  # the history's max, this step's amax included (read from the register, not back from memory)
            columns = tl.arange(0, HISTORY_BLOCK)
            past = tl.load(history_row + columns, mask=(columns < history_len) & (columns != cursor), other=0.0)
            chosen = tl.maximum(tl.max(past, 0), amax)
            chosen = tl.where((tl.max((past != past).to(tl.int32), 0) > 0) | (amax != amax), float("nan"), chosen)

        scale_ptr = tl.load(scale_addresses + row // 3).to(tl.pointer_type(tl.float32)) + role
        # A role with no amax recorded yet (all-zero history), or a NaN in it, keeps its scale, as the op-by-op update.
        scale = tl.where(chosen > 0, tl.math.div_rn(tl.load(limits + role), chosen * margin_factor), tl.load(scale_ptr))
        tl.store(scale_ptr, scale)
        inverse = tl.load(scale_inv_addresses + row).to(tl.pointer_type(tl.float32))
        tl.store(inverse, tl.math.div_rn(1.0, scale))


class ScaleUpdateLaunch:
    """The update of every linear's scales in one launch. Keeps the tables of addresses and lengths for the next
    step (they are uploaded again only if a buffer moves or is resized)."""

    def __init__(self) -> None:
        self._tables = {name: DeviceInts() for name in ("amax", "lengths", "scale", "scale_inv")}

    def __call__(
        self,
        amax_buffers: list[torch.Tensor],  # linear-major, role-minor: the history's row order
        scales: list[torch.Tensor],
        scale_invs: list[torch.Tensor],
        history: torch.Tensor,
        limits: torch.Tensor,
        cursor: int,
        margin: int,
        most_recent: bool,
        reduce: Callable[[torch.Tensor], object] | None = None,
    ) -> None:
        """The update in one launch; with `reduce` (which reduces this step's amaxes, one per history row, in place,
        e.g. over ranks), in two: the recordings into a vector, `reduce` on it, then the rest from the vector."""
        rows, history_len = history.numel() // history.shape[-1], history.shape[-1]
        if len(amax_buffers) != rows or len(scale_invs) != rows or 3 * len(scales) != rows:
            raise ValueError(
                f"{rows} history rows need as many amax recordings and inverses, and a third as many scales"
            )
        staged = history.new_empty(rows) if reduce is not None else history  # (unread in one launch)
        args = (
            addresses(self._tables["amax"], amax_buffers),
            self._tables["lengths"]([b.numel() for b in amax_buffers], history.device),
            staged,
            history,
            addresses(self._tables["scale"], scales),
            addresses(self._tables["scale_inv"], scale_invs),
            limits,
            cursor,
            history_len,
            2.0**margin,
        )
        sizes = dict(MOST_RECENT=most_recent, ROW_BLOCK=_ROW_BLOCK, HISTORY_BLOCK=triton.next_power_of_2(history_len))
        if reduce is None:
            _scale_update_kernel[(rows,)](*args, STAGE=0, **sizes)
            return
        _scale_update_kernel[(rows,)](*args, STAGE=1, **sizes)
        reduce(staged)
        _scale_update_kernel[(rows,)](*args, STAGE=2, **sizes)
