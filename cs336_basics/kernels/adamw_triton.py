"""The fused master-weight AdamW update as one Triton kernel launch for a whole list of tensors (CUDA).

One pass over memory per parameter: read the BF16 gradient, the fp32 master and both fp32 moments; write the
master, the moments and the rounded BF16 weight (28 bytes per parameter). torch's fused AdamW cannot take BF16
gradients for fp32 masters or write a second copy of the weight, so with it the step needs separate passes to
cast, clip and copy back (52 bytes per parameter).

One launch covers every tensor of a list (multi_tensor.py: the kernel reads each through a table of addresses), so
the host pays one launch per parameter group instead of one per parameter, which a short FP8 step waits for. Its
accesses are 16-byte vectors where every tensor allows them (multi_tensor_triton.py says why that matters).

What it saves, and what the alternatives cost: INDEX.md: 2026-11-21-optimizer-step-h200.json (the update against the
separate passes and against torch's fused AdamW on BF16 weights without masters) and INDEX.md:
2026-11-21-optimizer-step-alternatives-h200.json (torch.compile of the same update: compiling one call over a whole
parameter group takes minutes per run, and a compiled call per tensor pays dynamo's per-call overhead on every
tensor). A Triton kernel compiles once, in under a second.

Imported only on CUDA machines: triton ships with torch's Linux CUDA wheels.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from cs336_basics.kernels.multi_tensor import BlockLayout, DeviceInts, addresses, contiguous, vector_aligned
from cs336_basics.kernels.multi_tensor_triton import block_of_tensor, tensor_at

__all__ = ["AdamWLaunch"]

_BLOCK_SIZE = 2048
_TENSORS = ("grad", "master", "exp_avg", "exp_avg_sq", "step", "param")
_VECTOR_ACCESSED = tuple(name for name in _TENSORS if name != "step")  # a step counter is one scalar


def _log2(beta: float) -> float:
    return math.log2(beta) if beta > 0 else -math.inf  # beta = 0: beta**step = exp2(-inf) = 0


@triton.jit
def _adamw_kernel(
    grad_addresses,
    master_addresses,
    exp_avg_addresses,
    exp_avg_sq_addresses,
    step_addresses,
    param_addresses,
    tensor_of_block,
    first_block,
    numel,
    grad_like,  # a gradient and a weight: their element types are the kernel's (one launch has one of each)
    param_like,
    lr_ptr,
    grad_scale_ptr,
    beta1,
    beta2,
    log2_beta1,
    log2_beta2,
    eps,
    weight_decay,
    WRITE_PARAM: tl.constexpr,
    ALIGNED: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    t, offsets, mask = block_of_tensor(tensor_of_block, first_block, numel, ALIGNED, BLOCK_SIZE)
    grad_ptr = tensor_at(grad_addresses, t, grad_like.dtype.element_ty, ALIGNED)
    master_ptr = tensor_at(master_addresses, t, tl.float32, ALIGNED)
    exp_avg_ptr = tensor_at(exp_avg_addresses, t, tl.float32, ALIGNED)
    exp_avg_sq_ptr = tensor_at(exp_avg_sq_addresses, t, tl.float32, ALIGNED)
    step = tl.load(tl.load(step_addresses + t).to(tl.pointer_type(tl.float32)))
    lr = tl.load(lr_ptr)
    g = tl.load(grad_ptr + offsets, mask=mask).to(tl.float32) * tl.load(grad_scale_ptr)
    w = tl.load(master_ptr + offsets, mask=mask)
    m = tl.load(exp_avg_ptr + offsets, mask=mask)
    v = tl.load(exp_avg_sq_ptr + offsets, mask=mask)

    # The same sequence as adamw.adamw_update (and torch.optim.AdamW); beta**step as exp2(step * log2(beta)).
    w = w * (1.0 - lr * weight_decay)
    m = m + (1.0 - beta1) * (g - m)
    v = v * beta2 + (1.0 - beta2) * g * g
    step_size = lr / (1.0 - tl.exp2(step * log2_beta1))
    denom = tl.sqrt(v) / tl.sqrt(1.0 - tl.exp2(step * log2_beta2)) + eps
    w = w - step_size * m / denom

    tl.store(master_ptr + offsets, w, mask=mask)
    tl.store(exp_avg_ptr + offsets, m, mask=mask)
    tl.store(exp_avg_sq_ptr + offsets, v, mask=mask)
    if WRITE_PARAM:
        param_ptr = tensor_at(param_addresses, t, param_like.dtype.element_ty, ALIGNED)
        tl.store(param_ptr + offsets, w.to(param_like.dtype.element_ty), mask=mask)


class AdamWLaunch:
    """`adamw.adamw_update` (same arguments; `step` already incremented) of a list of tensors in one kernel launch.

    Each call takes lists of the same length: gradients of one dtype, and the weights to write (`params`) all of one
    dtype, or None for fp32 parameters that are their own masters. The address tables and the block layout are kept
    for the next call: keep one AdamWLaunch per list of parameters.
    """

    def __init__(self) -> None:
        self._addresses = {name: DeviceInts() for name in _TENSORS}
        self._layout = BlockLayout(_BLOCK_SIZE)

    def __call__(
        self,
        grads: list[torch.Tensor],
        masters: list[torch.Tensor],
        exp_avgs: list[torch.Tensor],
        exp_avg_sqs: list[torch.Tensor],
        steps: list[torch.Tensor],
        lr: torch.Tensor,
        grad_scale: torch.Tensor,
        beta1: float,
        beta2: float,
        eps: float,
        weight_decay: float,
        params: list[torch.Tensor] | None,
    ) -> None:
        grads = contiguous(grads)
        written = masters if params is None else params  # never written when WRITE_PARAM is False
        tables = [
            addresses(self._addresses[name], tensors)
            for name, tensors in zip(_TENSORS, (grads, masters, exp_avgs, exp_avg_sqs, steps, written), strict=True)
        ]
        layout = self._layout(masters)
        _adamw_kernel[(layout.programs,)](
            *tables,
            layout.tensor_of_block,
            layout.first_block,
            layout.numel,
            grads[0],
            written[0],
            lr,
            grad_scale,
            beta1,
            beta2,
            _log2(beta1),
            _log2(beta2),
            eps,
            weight_decay,
            WRITE_PARAM=params is not None,
            ALIGNED=vector_aligned(layout, *(self._addresses[name] for name in _VECTOR_ACCESSED)),
            BLOCK_SIZE=_BLOCK_SIZE,
        )
