"""What torch.compile (and DDP) do to a module, known in one place.

`torch.compile(model)` returns a wrapper that holds the real module as `_orig_mod`, so names taken from the wrapper
(or from submodules compiled on their own) carry an `_orig_mod.` prefix; `module.compile()` keeps the class and
stores the compiled forward in `_compiled_call_impl`. Checkpoints, optimizer state and FP8 conversion all work on
the plain module and its plain names.
"""

from __future__ import annotations

from torch import nn

COMPILE_PREFIX = "_orig_mod."


def plain_name(name: str) -> str:
    """A parameter / state-dict name without torch.compile's wrapper prefixes."""
    return name.replace(COMPILE_PREFIX, "")


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module under torch.compile / DistributedDataParallel wrappers."""
    from torch._dynamo.eval_frame import OptimizedModule  # deferred: importing dynamo is not free

    while True:
        if isinstance(model, OptimizedModule):
            model = model._orig_mod
        elif isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        else:
            return model


def is_compiled(model: nn.Module) -> bool:
    from torch._dynamo.eval_frame import OptimizedModule

    return isinstance(model, OptimizedModule)


def compiled_submodules(model: nn.Module) -> list[str]:
    """Names of the modules that are torch.compile wrappers or were compiled in place with module.compile()."""
    from torch._dynamo.eval_frame import OptimizedModule

    return [
        name or "<the model itself>"
        for name, module in model.named_modules()
        if isinstance(module, OptimizedModule) or getattr(module, "_compiled_call_impl", None) is not None
    ]
