"""What one optimizer step costs, on a preset's real parameter shapes.

Times the step of a BF16 model four ways, each on fresh optimizer state with the same random BF16 gradients:

  masters-fused      MasterWeightAdamW as the Trainer uses it: one Triton launch per parameter group
                     (kernels/adamw_triton.py)
  masters-eager      the same formula run op by op (what the kernel fuses)
  masters-unfused    the path it replaced: BF16 grads cast into fp32 copies, torch's clip_grad_norm_, torch's
                     fused AdamW on the fp32 masters, then a copy back into the BF16 weights
  bf16-no-masters    torch's fused AdamW straight on the BF16 weights (BF16 moments, no masters): the floor,
                     and what trainers without master weights pay (at the cost of stalled small updates)

Reports the median step in ms over CUDA-event-timed steps, and the memory the step allocates on top of the
model, its grads and the optimizer state (the unfused path's fp32 grad copies show up there).

    python -m lab.optimizer_step --presets 366m 1.3b --json out.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from cs336_basics.config_layers import build_config
from cs336_basics.devices import require_cuda
from cs336_basics.diagnostics.measurement import release_memory
from cs336_basics.errors import ConfigError, report_error
from cs336_basics.measure.results import run_record, write_results
from cs336_basics.measure.timing import time_calls_ms
from cs336_basics.model import TransformerLM
from cs336_basics.optim import MasterWeightAdamW

VARIANTS = ("masters-fused", "masters-eager", "masters-unfused", "bf16-no-masters")
HP = {"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
MAX_GRAD_NORM = 1.0


class UnfusedMasterAdamW:
    """The four-pass master-weight step, built from torch's own optimizer pieces (the baseline)."""

    def __init__(self, params: list[torch.nn.Parameter]):
        self.params = params
        self.masters = [p.detach().float().clone() for p in params]
        # The same groups as MasterWeightAdamW: weight decay on matrices only.
        groups = [
            {"params": [m for m in self.masters if m.ndim >= 2]},
            {"params": [m for m in self.masters if m.ndim < 2], "weight_decay": 0.0},
        ]
        self.inner = torch.optim.AdamW([g for g in groups if g["params"]], fused=True, **HP)

    @torch.no_grad()
    def step(self) -> None:
        for m in self.masters:
            if m.grad is None:
                m.grad = torch.empty_like(m)
        torch._foreach_copy_([m.grad for m in self.masters], [p.grad for p in self.params])
        torch.nn.utils.clip_grad_norm_(self.masters, MAX_GRAD_NORM, foreach=True)
        self.inner.step()
        torch._foreach_copy_(self.params, self.masters)
        for m in self.masters:
            m.grad = None


def _make_step(variant: str, model: torch.nn.Module) -> Callable[[], Any]:
    params = list(model.parameters())
    if variant in ("masters-fused", "masters-eager"):
        opt = MasterWeightAdamW(model.named_parameters(), fused=variant == "masters-fused", **HP)
        return lambda: opt.step(max_grad_norm=MAX_GRAD_NORM)
    if variant == "masters-unfused":
        return UnfusedMasterAdamW(params).step
    if variant == "bf16-no-masters":
        opt = torch.optim.AdamW(params, fused=True, **HP)

        def step() -> None:
            torch.nn.utils.clip_grad_norm_(params, MAX_GRAD_NORM, foreach=True)
            opt.step()

        return step
    raise ValueError(f"unknown variant {variant!r}; choose from {VARIANTS}")


def time_variant(variant: str, model: torch.nn.Module, warmup: int, steps: int) -> dict[str, float]:
    """Median step time and the step's own peak allocation (beyond what exists before it)."""
    step = _make_step(variant, model)
    t0 = time.perf_counter()
    for _ in range(warmup):  # compiles, allocates optimizer state
        step()
    torch.cuda.synchronize()
    warmup_s = time.perf_counter() - t0
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    times = time_calls_ms(step, steps)
    extra = torch.cuda.max_memory_allocated() - before
    return {
        "optimizer_step_ms": statistics.median(times),
        "step_extra_mem_gib": extra / 2**30,
        "warmup_s": warmup_s,  # includes any kernel compile
    }


def measure_preset(preset: str, variants: tuple[str, ...], warmup: int, steps: int) -> list[dict[str, Any]]:
    # A plain BF16 model: the optimizer never sees FP8 (torchao keeps weights as BF16 parameters).
    config = build_config({"preset": preset, "train": {"dtype": "bfloat16"}, "fp8": {"use_fp8": False}})
    records = []
    for variant in variants:
        torch.manual_seed(0)
        model = TransformerLM(config.model).to("cuda", torch.bfloat16)
        for p in model.parameters():  # gradients of a realistic scale, never zeros
            p.grad = torch.randn_like(p) * 1e-3
        n_params = sum(p.numel() for p in model.parameters())
        measured = time_variant(variant, model, warmup, steps)
        print(
            f"{preset:>10} {variant:>16}: {measured['optimizer_step_ms']:7.2f} ms/step, "
            f"+{measured['step_extra_mem_gib']:.2f} GiB during the step, warm-up {measured['warmup_s']:.1f} s",
            flush=True,
        )
        records.append(
            run_record(config, optimizer=variant, params=n_params, timed_steps=steps, compile=False, **measured)
        )
        del model
        release_memory()
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lab.optimizer_step",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--presets", nargs="+", default=["366m", "1.3b"])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--json", help="write {gpu, torch, torchao, command, runs} here")
    args = parser.parse_args(argv)
    try:
        require_cuda("the optimizer-step benchmark", "it times CUDA kernels")
    except ConfigError as exc:
        return report_error(exc)
    runs = [r for preset in args.presets for r in measure_preset(preset, tuple(args.variants), args.warmup, args.steps)]
    if args.json:
        write_results(args.json, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
