"""Global-norm gradient clipping: one rule for MasterWeightAdamW (which folds it into its update) and the
course's ``gradient_clipping`` (which scales the ``.grad`` tensors in place)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

__all__ = ["CLIP_EPS", "clip_coefficient", "global_grad_norm", "gradient_clipping"]

# Guards the division by a zero norm; the course's and torch.nn.utils.clip_grad_norm_'s value.
CLIP_EPS = 1e-6


def global_grad_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The L2 norm of all gradients together, as a 0-d float32 tensor (accumulated in fp32 from any dtype)."""
    # One multi-tensor launch on CUDA for the per-tensor norms.
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0, dtype=torch.float32)))


def clip_coefficient(norm: torch.Tensor, max_norm: float) -> torch.Tensor:
    """The factor that brings gradients of global norm ``norm`` within ``max_norm``: 1 if they already are,
    else max_norm / (norm + 1e-6). A device tensor, so nothing waits for the GPU."""
    return torch.clamp(max_norm / (norm + CLIP_EPS), max=1.0)


@torch.no_grad()
def gradient_clipping(parameters: Iterable[torch.nn.Parameter], max_l2_norm: float) -> torch.Tensor:
    """Scale the gradients of ``parameters`` in place so that their global L2 norm is at most ``max_l2_norm``.

    Parameters without a gradient are skipped. Returns the norm before clipping (0 when no parameter has a
    gradient).
    """
    if max_l2_norm < 0:
        raise ValueError(f"max_l2_norm must be >= 0, got {max_l2_norm}.")
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.zeros(())
    norm = global_grad_norm(grads)
    coefficient = clip_coefficient(norm, max_l2_norm)
    for g in grads:
        g.mul_(coefficient)
    return norm
