"""What torch.compile (and DDP) do to a module, known in one place.

`torch.compile(model)` returns a wrapper that holds the real module as `_orig_mod`, so names taken from the wrapper
(or from submodules compiled on their own) carry an `_orig_mod.` prefix; `module.compile()` keeps the class and
stores the compiled forward in `_compiled_call_impl`. Checkpoints, optimizer state and FP8 conversion all work on
the plain module and its plain names.
"""

from __future__ import annotations

import sys

from torch import nn

COMPILE_PREFIX = "_orig_mod."


def _optimized_module() -> type | None:
    """torch.compile's wrapper class, or None if dynamo was never imported (then nothing can be compiled, and
    importing it just to ask would cost seconds)."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    return eval_frame.OptimizedModule if eval_frame is not None else None


def plain_name(name: str) -> str:
    """A parameter / state-dict name without torch.compile's wrapper prefixes."""
    return name.replace(COMPILE_PREFIX, "")


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module under torch.compile / DistributedDataParallel wrappers."""
    wrapper = _optimized_module()
    while True:
        if wrapper is not None and isinstance(model, wrapper):
            model = model._orig_mod
        elif isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        else:
            return model


def is_compiled(model: nn.Module) -> bool:
    wrapper = _optimized_module()
    return wrapper is not None and isinstance(model, wrapper)


def compiled_submodules(model: nn.Module) -> list[str]:
    """Names of the modules that are torch.compile wrappers or were compiled in place with module.compile()."""
    return [
        name or "<the model itself>"
        for name, module in model.named_modules()
        if is_compiled(module) or getattr(module, "_compiled_call_impl", None) is not None
    ]
