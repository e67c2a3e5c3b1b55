"""The fused master-weight AdamW update as one Triton kernel per tensor (CUDA).

One pass over memory per parameter: read the BF16 gradient, the fp32 master and both fp32 moments; write the
master, the moments and the rounded BF16 weight (28 bytes per parameter). torch's fused AdamW cannot take BF16
gradients for fp32 masters or write a second copy of the weight, so with it the step needs separate passes to
cast, clip and copy back (52 bytes per parameter).

What it saves, and what the alternatives cost: benchmarks/results/2026-11-21-optimizer-step-h200.json (this kernel
against the separate passes and against torch's fused AdamW on BF16 weights without masters) and
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

__all__ = ["fused_adamw_update"]

_BLOCK_SIZE = 2048


def _log2(beta: float) -> float:
    return math.log2(beta) if beta > 0 else -math.inf  # beta = 0: beta**step = exp2(-inf) = 0


@triton.jit
def _adamw_kernel(
    grad_ptr,
    master_ptr,
    exp_avg_ptr,
    exp_avg_sq_ptr,
    param_ptr,
    step_ptr,
    lr_ptr,
    grad_scale_ptr,
    n_elements,
    beta1,
    beta2,
    log2_beta1,
    log2_beta2,
    eps,
    weight_decay,
    WRITE_PARAM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    step = tl.load(step_ptr)
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
        tl.store(param_ptr + offsets, w.to(param_ptr.dtype.element_ty), mask=mask)


def fused_adamw_update(
    grad: torch.Tensor,
    master: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    step: torch.Tensor,
    lr: torch.Tensor,
    grad_scale: torch.Tensor,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    param: torch.Tensor | None,
) -> None:
    """`adamw.adamw_update` (same arguments; `step` already incremented) in one kernel launch."""
    n = master.numel()
    _adamw_kernel[(triton.cdiv(n, _BLOCK_SIZE),)](
        grad if grad.is_contiguous() else grad.contiguous(),
        master,
        exp_avg,
        exp_avg_sq,
        master if param is None else param,  # never written when WRITE_PARAM is False
        step,
        lr,
        grad_scale,
        n,
        beta1,
        beta2,
        _log2(beta1),
        _log2(beta2),
        eps,
        weight_decay,
        WRITE_PARAM=param is not None,
        BLOCK_SIZE=_BLOCK_SIZE,
    )
