"""Learning-rate schedule: linear warmup, then cosine decay to a floor (the CS336 schedule)."""

from __future__ import annotations

import math

__all__ = ["cosine_lr", "min_lr_from"]


def cosine_lr(step: int, max_lr: float, min_lr: float, warmup_steps: int, total_steps: int) -> float:
    """Learning rate for optimizer step `step` (0-based).

    - step < warmup_steps: linear ramp max_lr * step / warmup_steps (so step 0 trains at lr 0);
    - warmup_steps <= step <= total_steps: min_lr + (1 + cos(pi * progress)) / 2 * (max_lr - min_lr),
      with progress going 0 -> 1 over the decay phase;
    - step > total_steps: min_lr.
    warmup_steps == 0 starts straight at max_lr; total_steps <= warmup_steps (no decay phase) holds
    max_lr until step == warmup_steps and min_lr after it. Neither divides by zero.
    """
    if step < warmup_steps:  # implies warmup_steps > 0
        return max_lr * step / warmup_steps
    decay_steps = total_steps - warmup_steps
    if step > total_steps or (decay_steps <= 0 and step > warmup_steps):
        return min_lr
    if decay_steps <= 0:
        return max_lr
    progress = (step - warmup_steps) / decay_steps
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (max_lr - min_lr)


def min_lr_from(warmup_steps: int, total_steps: int) -> int:
    """The first step at which cosine_lr gives min_lr (and keeps it): the decay's end; where the warmup leaves no
    decay phase, the step after a warmup that ends at total_steps, or the warmup's end where it outlasts them."""
    if warmup_steps == total_steps:
        return total_steps + 1
    return max(warmup_steps, total_steps)
