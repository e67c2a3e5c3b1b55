"""What torch.compile (and DDP) do to a module, known in one place.

`torch.compile(model)` returns a wrapper that holds the real module as `_orig_mod`, so names taken from the wrapper
(or from submodules compiled on their own) carry an `_orig_mod.` prefix; `module.compile()` keeps the class and
stores the compiled forward in `_compiled_call_impl`; the Trainer compiles regions in place, setting a compiled
function as an instance attribute (a block's `forward`). Checkpoints, optimizer state and FP8 conversion all work on
the plain module and its plain names.
"""

from __future__ import annotations

import contextlib
import sys
from typing import TYPE_CHECKING

import torch
from torch import nn

from cs336_basics.config import CUDA_GRAPH_MODES
from cs336_basics.errors import ConfigError

if TYPE_CHECKING:
    from cs336_basics.config import TrainConfig
    from cs336_basics.parallel.world import World

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
    """Names of the modules that are torch.compile wrappers or were compiled in place: by module.compile(), or by a
    compiled function set as an attribute of their own (parallel/wrap.py compile_for_training)."""
    return [
        name or "<the model itself>"
        for name, module in model.named_modules()
        if is_compiled(module)
        or getattr(module, "_compiled_call_impl", None) is not None
        or any(hasattr(value, "_torchdynamo_orig_callable") for value in vars(module).values())
    ]


def write_shared_fp8_gemm_inputs_once() -> None:
    """Have inductor write once a tensor that several `_scaled_mm` read: the FP8 cast of q/k/v's input (or w1/w3's)
    that the RMSNorm before them writes. Inductor realizes an input that several `mm` read before lowering them (its
    `needs_realized_inputs`), not one of `_scaled_mm`, whose stride constraint then copies the not yet realized cast
    for each GEMM: the norm's kernel stored the same FP8 tensor three times for q/k/v and twice for w1/w3. The values
    do not change, only the bytes written. A private registry of inductor's, idempotent; a torch without it keeps
    the copies (tests/test_trainer.py checks that the pinned torch has it)."""
    from torch._inductor import lowering

    register = getattr(lowering, "add_needs_realized_inputs", None)
    if register is not None:
        register(torch.ops.aten._scaled_mm.default)


@contextlib.contextmanager
def eager():
    """Run code that calls a module compiled in place without compiling anything: a no-grad evaluation would
    otherwise compile each region once more (grad mode is part of what a compiled graph assumes), and under CUDA
    graphs record graphs of its own."""
    with torch.compiler.set_stance("force_eager"):
        yield


def resolve_compile_scope(scope: str, own_model: bool, fsdp: bool) -> tuple[str, str]:
    """--compile_scope: (blocks or model, why). Blocks need this package's model (its `layers`); FSDP2 needs them
    (its hooks run around each block, outside the graph). A scope asked for that cannot be honoured is an error."""
    if scope == "auto":
        if not own_model:
            return "model", "a Hugging Face model is compiled whole"
        return "blocks", "one graph per block, shared by all blocks: a first run compiles several times faster"
    if scope == "blocks" and not own_model:
        raise ConfigError("--compile_scope blocks compiles this package's model only; use model (or auto).")
    if scope == "model" and fsdp:
        raise ConfigError(
            "--compile_scope model cannot run under FSDP2, whose hooks around each block a whole-model graph cannot "
            "trace; use blocks (or auto)."
        )
    return scope, "asked for"


def runs_cuda_graphs(compile_model: bool, mode: str, device: torch.device) -> bool:
    """Whether a compiled step in `mode` on `device` replays under CUDA graphs."""
    return bool(compile_model) and device.type == "cuda" and mode in CUDA_GRAPH_MODES


def resolve_compile_mode(
    train: TrainConfig, use_fp8: bool, device: torch.device, parallel_mode: str
) -> tuple[str, str]:
    """--compile_mode: (mode, why): the one asked for, or auto's choice (auto_compile_mode)."""
    if train.compile_mode != "auto":
        return train.compile_mode, "asked for"
    return auto_compile_mode(train, use_fp8, device, parallel_mode)


def auto_compile_mode(train: TrainConfig, use_fp8: bool, device: torch.device, parallel_mode: str) -> tuple[str, str]:
    """--compile_mode auto: (mode, why) for a run in `parallel_mode` (none, ddp, fsdp). CUDA graphs (reduce-overhead)
    replay a whole compiled step in one launch. They pay where the step waits for the host: FP8's, whose casts and
    scaled GEMMs are more and smaller kernels than BF16's (at gpt2-small the FP8 step is host-bound, the BF16 step is
    not, and CUDA graphs leave BF16's speed as it was: INDEX.md: 2026-11-24-compile-auto-h200). With gradient
    accumulation the Trainer sums the micro-batches' gradients outside the graphs (training/accumulation.py). Under
    DDP the FP8 step replays under CUDA graphs too, measured ahead of the step without them on 2 GPUs, without
    accumulation (2026-11-28-ddp-levers-4xh200) and with it, where every micro-batch skips DDP's overlapped reduction
    and the sums are averaged over the ranks after the last one (2026-11-28-ddp-default-4xh200). Under FSDP2 the FP8
    step replays under them too, with each unit's gathered weights kept allocated so that the graphs replay
    (parallel/fsdp_graphs.py; measured on 2 GPUs: 2026-11-29-fsdp2-graphs-default-x2-h200); the memory that costs
    is one gathered copy of the weights per GPU, as DDP holds, which --compile_mode default gives back. FSDP2
    reduce-scatters each micro-batch's gradients from inside backward, which the graphs' accumulation does not
    cover, so with accumulation it runs without them.
    Where they are left out, --compile_mode reduce-overhead asks for them
    (build.check_cuda_graphs_request refuses the one mix that cannot run). A C++ wrapper asked for (--compile_wrapper
    cpp) keeps them out: inductor turns CUDA graphs off under it."""
    if not (train.compile_model and device.type == "cuda"):
        return "default", "no compiled CUDA step"
    if train.compile_wrapper == "cpp":
        return "default", "--compile_wrapper cpp asked for: inductor runs its C++ wrapper without CUDA graphs"
    if not use_fp8:
        return "default", "a BF16 step keeps the GPU busy: CUDA graphs would not speed it up"
    if parallel_mode == "fsdp" and train.gradient_accumulation_steps > 1:
        return "default", (
            "CUDA graphs under FSDP2 do not cover gradient accumulation (its gradients reduce-scatter inside backward)"
        )
    ddp = parallel_mode == "ddp"
    if parallel_mode == "fsdp":
        why = (
            "CUDA graphs under FSDP2: the FP8 step's kernels off the host, measured faster; the gathered weights "
            "stay allocated (--compile_mode default gives that memory back)"
        )
    elif ddp:
        why = "CUDA graphs under DDP: the FP8 step's kernels off the host, measured faster"
    else:
        why = "CUDA graphs: the FP8 step's many small kernels launched at once, off the host"
    if train.gradient_accumulation_steps > 1:
        why += "; micro-batch gradients summed outside the graphs"
        why += ", averaged over the ranks after the last" if ddp else ""
    return "reduce-overhead", why


def resolve_compile_wrapper(
    train: TrainConfig, device: torch.device, world: World, parallel_mode: str = "none", fp8_path: str | None = None
) -> tuple[str, str]:
    """--compile_wrapper: (python or cpp, why): the one asked for, or auto's choice (auto_compile_wrapper). Asked for
    where it cannot be honoured, an error: without a compiled step, or with CUDA graphs, which inductor switches off
    under its C++ wrapper (get_cpp_wrapper_config). Call it with the compile mode resolved."""
    if train.compile_wrapper == "auto":
        return auto_compile_wrapper(train, device, world, parallel_mode, fp8_path)
    if train.compile_wrapper == "cpp" and not train.compile_model:
        raise ConfigError(
            "--compile_wrapper cpp is the code torch.compile generates, and this run compiles nothing: "
            "add --compile_model (or leave --compile_wrapper at auto)."
        )
    if train.compile_wrapper == "cpp" and runs_cuda_graphs(train.compile_model, train.compile_mode, device):
        raise ConfigError(
            f"--compile_wrapper cpp cannot run with --compile_mode {train.compile_mode}: inductor turns CUDA graphs "
            "off under its C++ wrapper. Use --compile_mode default (or max-autotune-no-cudagraphs) with it, or "
            "--compile_wrapper python (or auto) with CUDA graphs."
        )
    return train.compile_wrapper, "asked for"


def auto_compile_wrapper(
    train: TrainConfig, device: torch.device, world: World, parallel_mode: str = "none", fp8_path: str | None = None
) -> tuple[str, str]:
    """--compile_wrapper auto: (wrapper, why) for a run in `parallel_mode` whose FP8 path is `fp8_path` (None without
    FP8). Inductor's wrapper is the host code that allocates a compiled region's buffers and launches its kernels,
    once per call. Without CUDA graphs it runs every step, and an FP8 step, with more and smaller kernels than BF16's,
    waits for it: generated as C++ it launches them with less host time than Python (INDEX.md: 2026-11-28-cpp-wrapper).
    Its cost is compile time: the C++ headers, built once per machine (then cached), and a C++ build of each
    graph's wrapper (compile_options skips inductor's checks of the CPU's vector instructions, once most of the
    cost). Under CUDA graphs the replays skip the wrapper, so it stays Python there. Across several processes it is
    C++ for the fused FP8 path under FSDP2, whose step FSDP2's hooks leave waiting for the host
    (2026-11-28-fsdp2-cpp-wrapper-x2-h200); BF16 under FSDP2 ran no faster with it, and the rest is not measured, so
    it stays Python (--compile_wrapper cpp asks)."""
    if not (train.compile_model and device.type == "cuda"):
        return "python", "no compiled CUDA step"
    if runs_cuda_graphs(train.compile_model, train.compile_mode, device):
        return "python", "CUDA graphs replay the kernels without the wrapper"
    if parallel_mode == "fsdp" and fp8_path == "fused":  # FSDP2 runs under torchrun only
        return "cpp", "under FSDP2 the fused FP8 step waits for the host: C++ launches its kernels faster"
    if world.launched:
        return "python", "across several processes C++ measured faster only for the fused FP8 path under FSDP2"
    return "cpp", "without CUDA graphs the step waits for the host: C++ launches its kernels faster"


# The wrapper of a compiled step that is profiled or whose allocations are traced: its calls are recorded ops, and
# its generated source lines name the buffers (hides_ops_from_profiler says what the C++ wrapper hides).
PROFILED_WRAPPER = "python"


def hides_ops_from_profiler(train: TrainConfig, device: torch.device) -> str | None:
    """Why the profiler cannot attribute this compiled step's kernels to the ops that launched them (the GEMMs'
    shapes, the FP8 GEMM counts), or None where it can: CUDA graph replays launch no op, and the C++ wrapper calls
    its ops through inductor's C shim, unrecorded. A profile then comes from a twin compiled without them."""
    if runs_cuda_graphs(train.compile_model, train.compile_mode, device):
        return f"{train.compile_mode}'s CUDA graph replays hide the step's ops from the profiler"
    if train.compile_model and train.compile_wrapper == "cpp":
        return "the C++ wrapper's calls hide the step's ops from the profiler"
    return None


def compile_options(mode: str, wrapper: str, device_type: str) -> dict:
    """torch.compile's keyword arguments for a region compiled in `mode` with inductor's `wrapper` on `device_type`
    (fullgraph: a graph break is a bug we want to hear about). torch.compile takes a mode or inductor options, not
    both: the C++ wrapper is added to the options the mode stands for, with the settings inductor pairs with it
    (get_cpp_wrapper_config: its kernels' binaries kept for the C++ code to load). Inductor applies those itself
    where `cpp_wrapper` is set process-wide, but not to a backward compiled later, outside torch.compile's options:
    given as options, they reach the backward too (without them its compile stopped at "CudaKernelParamCache not
    populated").

    On CUDA the C++ wrapper is host code that allocates buffers and launches GPU kernels: no CPU kernel in it for a
    vector instruction set to speed up. Inductor would still check every set the CPU lists before it builds C++ in a
    process, each by loading a test library in a new Python process that imports torch: most of a warm compile, in
    every process (INDEX.md: 2026-11-29-cpp-wrapper-isa-checks-h200). `cpp.vec_isa_ok` False skips the checks and
    builds the wrapper without vector flags: first runs compiled much shorter and stepped as fast
    (INDEX.md: 2026-11-29-cpp-wrapper-no-isa-checks-h200)."""
    if wrapper == "python":
        return {"mode": mode, "fullgraph": True}
    from torch._inductor import list_mode_options
    from torch._inductor.compile_fx import get_cpp_wrapper_config

    options = {**list_mode_options(mode), "cpp_wrapper": True, **get_cpp_wrapper_config()}
    if device_type == "cuda":
        options["cpp.vec_isa_ok"] = False
    return {"options": options, "fullgraph": True}
