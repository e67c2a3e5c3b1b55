"""The course's functions, under the course's names and arguments.

Each is the implementation this package itself runs: the model's loss and reference attention
(``cs336_basics.model.functional``), the optimizer's clipping rule (``cs336_basics.optim.clipping``), the
trainer's schedule (``cosine_lr``) and batch sampler (``cs336_basics.data.batching.get_batch``, which already
takes the course's arguments and draws from ``np.random`` when no generator is given).
"""

from __future__ import annotations

from cs336_basics.data.batching import get_batch
from cs336_basics.model.functional import cross_entropy, scaled_dot_product_attention, silu, softmax
from cs336_basics.optim.clipping import gradient_clipping
from cs336_basics.optim.schedule import cosine_lr

__all__ = [
    "cross_entropy",
    "get_batch",
    "get_lr_cosine_schedule",
    "gradient_clipping",
    "scaled_dot_product_attention",
    "silu",
    "softmax",
]


def get_lr_cosine_schedule(
    it: int, max_learning_rate: float, min_learning_rate: float, warmup_iters: int, cosine_cycle_iters: int
) -> float:
    """Linear warmup from 0 to max_learning_rate over warmup_iters, cosine decay to min_learning_rate at
    cosine_cycle_iters, then min_learning_rate (``cosine_lr``, which the trainer uses)."""
    return cosine_lr(it, max_learning_rate, min_learning_rate, warmup_iters, cosine_cycle_iters)
