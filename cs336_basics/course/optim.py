"""The course's ``AdamW``: a plain ``torch.optim.Optimizer`` (param groups, closures, state dicts).

The update is the one ``MasterWeightAdamW`` and its fused kernel are tested against (``adamw_update``, the
formula of ``torch.optim.AdamW``), with decoupled weight decay on every parameter it is given. Where the
course's handout writes the same algorithm slightly differently (epsilon added to the square root of the
uncorrected second moment, decay applied after the Adam step), the results differ by O(eps) and
O(lr^2 * weight_decay) per step, which the course's own test accepts (it takes torch's AdamW as correct).

The training script keeps ``MasterWeightAdamW``: fp32 master weights for BF16 models, a fused CUDA step,
and no weight decay on 1-D parameters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from cs336_basics.optim.adamw import adamw_update

__all__ = ["AdamW"]


class AdamW(torch.optim.Optimizer):
    """AdamW (Loshchilov & Hutter). Moments are kept in float32; parameters of any float dtype are stepped
    in float32 and rounded back once."""

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
    ) -> None:
        if lr < 0:
            raise ValueError(f"lr must be >= 0, got {lr}.")
        if not all(0.0 <= b < 1.0 for b in betas) or len(betas) != 2:
            raise ValueError(f"betas must be two numbers in [0, 1), got {betas}.")
        if eps < 0:
            raise ValueError(f"eps must be >= 0, got {eps}.")
        if weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}.")
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("AdamW does not support sparse gradients.")
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32, memory_format=torch.preserve_format)
                for key in ("exp_avg", "exp_avg_sq"):
                    # load_state_dict casts state to the parameter's dtype; the moments stay float32.
                    if state[key].dtype != torch.float32:
                        state[key] = state[key].float()
                state["step"] += 1
                master = p if p.dtype == torch.float32 else p.float()
                adamw_update(
                    p.grad, master, state["exp_avg"], state["exp_avg_sq"], state["step"].to(p.device),
                    group["lr"], 1.0, beta1, beta2, group["eps"], group["weight_decay"], None if master is p else p,
                )  # fmt: skip
        return loss
