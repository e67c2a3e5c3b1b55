"""The lm_head in FP8 with the loss computed beside its GEMM (`--fp8_lm_head` on the fused path).

The lm_head's GEMMs are the largest of a course-scale model (vocab x dim per token), and its output gradient, the
gradient of the logits, is the largest tensor an FP8 cast would have to read: tokens x vocab. Cast like every other
gradient, it would be written in BF16, read for its amax, read again to be cast and transposed.

Here the head and the mean cross-entropy are one autograd function, so the gradient of the logits is written straight
in FP8 (E5M2 by default), in the kernel that computes it, and needs no amax pass: each entry is
dloss * (softmax - onehot(target)) / n_valid, and |softmax - onehot| <= 1, so dloss / n_valid bounds every entry.
That bound is the scale's amax. It is the true amax to within the largest |softmax - onehot| of the batch, which is
close to 1 for a language model (some token is always badly predicted), so the cast keeps the resolution dynamic
scaling would give it, and never saturates.

The forward writes it, not the backward: softmax - onehot needs no upstream gradient, whose scalar dloss / n_valid
only enters the GEMMs' scale. So the forward saves that FP8 tensor (half the bytes of the BF16 logits) and frees the
logits: at the step's peak, in the head's backward, the logits no longer sit beside the gradient's two FP8 layouts
(the study INDEX.md: 2026-11-24-head-memory-h200 found them there). The cast is the same up to the sign of dloss,
which moves into the scale.

Evaluation and sampling, which ask for logits, run the head as an ordinary FP8 linear (Fp8Linear).
"""

from __future__ import annotations

import torch
from torch import nn

from cs336_basics.precision.fused.linear import Fp8Linear, backward_gemms, forward_gemm, fp8_matmul
from cs336_basics.precision.fused.scaling import GRAD, INPUT, SiteScaling, cast_to_fp8, fp8_max

IGNORE_INDEX = -100  # F.cross_entropy's default, which the model's loss uses
# A frozen FP8 head makes its logits this many blocks of rows at a time (loss_and_unit_grads_by_rows); the LoRA
# memory probe found the whole BF16 logits beside their FP8 gradient at the step's peak
# (INDEX.md: 2026-11-26-lora-fused-rope).
LOGITS_ROW_BLOCKS = 4


def logits_row_blocks(rows: int) -> int:
    """The number of row blocks a frozen FP8 head splits `rows` rows of logits into: one forward GEMM and one
    backward GEMM each."""
    return min(LOGITS_ROW_BLOCKS, rows)


def summed_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(summed loss, log-sum-exp per row, valid-row mask) of 2-D logits, in float32, as F.cross_entropy computes
    them (rows whose target is IGNORE_INDEX are left out)."""
    lse = torch.logsumexp(logits.float(), dim=-1)
    valid = targets != IGNORE_INDEX
    picked = logits.gather(1, targets.clamp(min=0).unsqueeze(1)).squeeze(1).float()
    return torch.where(valid, lse - picked, 0.0).sum(), lse, valid


def cross_entropy_from_logits(
    logits: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(mean loss, log-sum-exp per row, valid-row mask, number of valid rows) of 2-D logits, in float32, as
    F.cross_entropy computes it (none valid gives nan)."""
    total, lse, valid = summed_cross_entropy(logits, targets)
    count = valid.sum()
    return total / count, lse, valid, count


def logits_grad(
    logits: torch.Tensor, lse: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor, row_scale: torch.Tensor
) -> torch.Tensor:
    """d loss / d logits in float32: (softmax - onehot(target)) * row_scale on valid rows, 0 on the others."""
    probs = torch.exp(logits.float() - lse.unsqueeze(1))
    columns = torch.arange(logits.shape[1], device=logits.device)
    onehot = columns.unsqueeze(0) == targets.unsqueeze(1)
    return (probs - onehot.float()) * torch.where(valid, row_scale, 0.0).unsqueeze(1)


def fp8_unit_logits_grad(
    logits: torch.Tensor, lse: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """softmax - onehot(target) (0 on rows left out), written in FP8 `dtype` as it is computed. Every entry lies
    within 1 (module docstring): that bound is the amax, so the scale is the format's max and no amax pass is
    needed. The gradient of the mean loss is this tensor times dloss / n_valid: `logits_grad_scale_inv`."""
    return cast_to_fp8(logits_grad(logits, lse, targets, valid, torch.ones_like(lse)), fp8_max(dtype), dtype)


def loss_and_unit_grads_by_rows(
    x_fp8: torch.Tensor,
    x_scale_inv: torch.Tensor,
    w_fp8: torch.Tensor,
    w_scale_inv: torch.Tensor,
    targets: torch.Tensor,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
    """(mean loss, fp8_unit_logits_grad of each block of rows, number of valid rows) of the logits x W^T, made
    LOGITS_ROW_BLOCKS blocks of rows at a time. A block's BF16 logits are freed once its loss and FP8 gradient are
    written, so the forward never holds more than one block of them beside the FP8 gradient it saves (half the
    logits' bytes): a frozen head's backward needs only dx, which each block's gradient gives for its rows."""
    blocks = logits_row_blocks(x_fp8.shape[0])
    total, grads = 0, []
    for x_rows, target_rows in zip(x_fp8.tensor_split(blocks), targets.tensor_split(blocks), strict=True):
        logits = fp8_matmul(x_rows, x_scale_inv, w_fp8.t(), w_scale_inv, fast_accum=True)
        block_total, lse, valid = summed_cross_entropy(logits, target_rows)
        total = total + block_total
        grads.append(fp8_unit_logits_grad(logits, lse, target_rows, valid, dtype))
        del logits  # before the next block's GEMM (uncompiled, the name would keep them alive)
    # Counted from the targets, not by summing the blocks' `valid` masks: compiled, that sum kept every block's logits
    # alive to the end (the head's forward peak rose to 1.5 logits; tests/test_lora.py's GPU memory test).
    count = (targets != IGNORE_INDEX).sum()
    return total / count, grads, count


def logits_grad_scale_inv(dloss: torch.Tensor, count: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The inverse scale that makes fp8_unit_logits_grad's tensor the gradient of the mean loss in the GEMMs."""
    return dloss.float() / count / fp8_max(dtype)


def loss_without_gradient(head: nn.Module, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """A loss head's mean cross-entropy when no gradient is wanted (evaluation): the logits alone, the forward's FP8
    gradient left unwritten."""
    return cross_entropy_from_logits(head(x).flatten(0, -2), targets.reshape(-1))[0]


class _Fp8LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, targets, scaling: SiteScaling, record: bool, weight):
        x2 = x.reshape(-1, x.shape[-1])
        x_fp8, x_scale_inv = scaling.cast(x2, INPUT, record)
        logits, w_t, w_scale_inv = forward_gemm(x_fp8, x_scale_inv, weight, scaling, record)
        targets = targets.reshape(-1)
        loss, lse, valid, count = cross_entropy_from_logits(logits, targets)
        g_fp8 = fp8_unit_logits_grad(logits, lse, targets, valid, scaling.dtypes[GRAD])
        ctx.save_for_backward(g_fp8, count, scaling.transposed(x_fp8), x_scale_inv, w_t, w_scale_inv)
        ctx.scaling, ctx.x_shape = scaling, x.shape
        return loss

    @staticmethod
    def backward(ctx, dloss):
        g_fp8, count, x_fp8_t, x_scale_inv, w_t, w_scale_inv = ctx.saved_tensors
        scaling = ctx.scaling
        g_scale_inv = logits_grad_scale_inv(dloss, count, scaling.dtypes[GRAD])
        fast = scaling.fast_accum_backward  # off for the head (convert.py)
        dx, dw = backward_gemms(
            g_fp8, scaling.transposed(g_fp8), g_scale_inv, w_t, w_scale_inv, x_fp8_t, x_scale_inv, fast
        )
        return dx.reshape(ctx.x_shape), None, None, None, dw


class Fp8LMHead(Fp8Linear):
    """An Fp8Linear that can also compute the model's loss with its GEMM (`linear_cross_entropy`), writing the
    gradient of the logits in FP8 as it computes it. The model calls that method when it has targets."""

    def linear_cross_entropy(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy of `targets` under x W^T; the same value as cross_entropy(self(x), targets)."""
        if not torch.is_grad_enabled():
            return loss_without_gradient(self, x, targets)
        return _Fp8LinearCrossEntropy.apply(x, targets, self.scaling, self.training, self.weight)

    def extra_repr(self) -> str:
        return super().extra_repr() + ", loss fused (logits' gradient cast where it is computed)"
