"""Optimisation: AdamW over FP32 master weights and the warmup + cosine learning-rate schedule."""

from cs336_basics.optim.adamw import MasterWeightAdamW, fused_by_default
from cs336_basics.optim.schedule import cosine_lr, min_lr_from

__all__ = ["MasterWeightAdamW", "cosine_lr", "fused_by_default", "min_lr_from"]
