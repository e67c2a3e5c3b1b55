"""Delayed scaling's update in one kernel launch against the op-by-op update, bit for bit: imported by the GPU test
and run under Triton's interpreter on the CPU (test_fused_fp8.py)."""

from __future__ import annotations

from unittest.mock import patch

import torch

from cs336_basics.precision.fused.scaling import E4M3, E5M2, DelayedScalingState, SiteScaling

SETTINGS = [("max", 0, 3), ("most_recent", 2, 4), ("max", 1, 20)]  # (algo, margin, history_len)


def _twins(device: str, algo: str, margin: int, history_len: int):
    twins = []
    for one_launch in (False, True):
        sites = [SiteScaling((E4M3, E4M3, E5M2), delayed=True, device=device, weight_rows=24) for _ in range(3)]
        state = DelayedScalingState(sites, history_len=history_len, algo=algo, margin=margin, one_launch=one_launch)
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


def check(device: str) -> None:
    same = dict(rtol=0, atol=0, equal_nan=True)
    for algo, margin, history_len in SETTINGS:
        states = _twins(device, algo, margin, history_len)
        gen = torch.Generator().manual_seed(0)
        for step in range(history_len + 3):  # past the history's wrap-around
            _record(states, gen, step)
            for state in states:
                state.update()
            reference, launched = states
            assert reference.cursor == launched.cursor
            torch.testing.assert_close(launched.history, reference.history, **same)
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
