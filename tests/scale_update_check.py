"""Delayed scaling's update in one kernel launch against the op-by-op update, bit for bit: imported by the GPU test
and run under Triton's interpreter on the CPU (test_fused_fp8.py)."""

from __future__ import annotations

import itertools
from unittest.mock import patch

import torch

from cs336_basics.precision.fused.scaling import E4M3, E5M2, DelayedScalingState, SiteScaling

SETTINGS = [("max", 0, 3), ("most_recent", 2, 4), ("max", 1, 20)]  # (algo, margin, history_len)


def _twins(device: str, algo: str, margin: int, history_len: int, reduce_amax=None):
    twins = []
    for one_launch in (False, True):
        sites = [SiteScaling((E4M3, E4M3, E5M2), delayed=True, device=device, weight_rows=24) for _ in range(3)]
        state = DelayedScalingState(
            sites, history_len=history_len, algo=algo, margin=margin, one_launch=one_launch, reduce_amax=reduce_amax
        )
        state.size_row_buffers(2500)  # more rows than the kernel reads in one block
        twins.append(state)
    return twins


def _record(states: list[DelayedScalingState], gen: torch.Generator, step: int) -> None:
    """The same recordings into both states: random amaxes, a role left unrecorded, and once a NaN."""
    for s, sites in enumerate(zip(*(state.sites for state in states), strict=True)):
        for r, buffers in enumerate(zip(*(site.amax_buffers() for site in sites), strict=True)):
            values = torch.rand(buffers[0].shape, generator=gen) * 10 ** (
                1 - step % 4
            )  # falling: the oldest is the max
            if (s + r + step) % 5 == 0:
                values.zero_()  # nothing recorded: the role keeps its scale
            if step == 2 and (s, r) == (1, 0):
                values[7] = float("nan")
            for buffer in buffers:
                buffer.copy_(values)


class OtherRank:
    """A stand-in for the all-reduce over ranks (DelayedScalingState's reduce_amax): the max with another rank's
    amaxes, drawn anew each step; the NaN it holds once must come through."""

    def __init__(self, rows: int, device: str):
        self.rows, self.device = rows, device
        self.amax = None

    def draw(self, gen: torch.Generator, step: int) -> None:
        self.amax = torch.rand(self.rows, generator=gen) * 10 ** (1 - (step + 2) % 4)
        if step == 3:
            self.amax[4] = float("nan")
        self.amax = self.amax.to(self.device)

    def __call__(self, amax: torch.Tensor) -> None:
        amax.copy_(torch.maximum(amax, self.amax))


def check(device: str) -> None:
    same = dict(rtol=0, atol=0, equal_nan=True)
    for (algo, margin, history_len), reduced in itertools.product(SETTINGS, (False, True)):
        other = OtherRank(3 * 3, device) if reduced else None
        states = _twins(device, algo, margin, history_len, reduce_amax=other)
        gen = torch.Generator().manual_seed(0)
        for step in range(history_len + 3):  # past the history's wrap-around
            _record(states, gen, step)
            own = torch.stack([site.amax for site in states[0].sites]).flatten()  # this process's amaxes
            if other is not None:
                other.draw(gen, step)
            for state in states:
                state.update()
            reference, launched = states
            assert reference.cursor == launched.cursor
            torch.testing.assert_close(launched.history, reference.history, **same)
            # What was filed: this process's amaxes, or their max with the other rank's.
            filed = reference.history[:, :, (reference.cursor - 1) % history_len].flatten()
            torch.testing.assert_close(filed, torch.maximum(own, other.amax) if other else own, **same)
            for want, got in zip(reference.sites, launched.sites, strict=True):
                torch.testing.assert_close(got.scale, want.scale, **same)
                torch.testing.assert_close(
                    torch.stack(got.scale_inv_buffers()), torch.stack(want.scale_inv_buffers()), **same
                )
                assert all(not b.any() for b in got.amax_buffers())  # the recordings are reset for the next step


def check_in_interpreter() -> None:
    """check('cpu') under Triton's interpreter (TRITON_INTERPRET=1 must be set before triton is imported).

    The interpreter holds a scalar as a one-element array and hands Python's `range` its bound as int(array), which
    NumPy 2.4 refuses ("only 0-dimensional arrays can be converted to Python scalars"), so the kernel's loop up to the
    length it loads fails in triton 3.6's interpreter. Triton's fix (triton-lang/triton#9171, #9172: the element taken
    out first) came after 3.6; until the lock's triton has it, this run mends the conversion the same way. Compiled
    kernels never run this code: their loop bound is the loaded scalar itself."""
    from triton.runtime import interpreter

    patch_tensor = interpreter._patch_lang_tensor

    def patch_tensor_with_scalar_index(tensor, scope) -> None:
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    with patch.object(interpreter, "_patch_lang_tensor", patch_tensor_with_scalar_index):
        check("cpu")
