"""The build stage every entry point shares: train_h100.py, the FP8 verification, the sweep worker and the Amdahl
analysis all turn a config into a model here, so each decision is made once, in one place.

    plan:  probe FP8 support (once per process and device) -> resolve every "auto" setting, each with its reason for
           the summary: dtype, compile on/off, compile scope, the FP8 path and its settings (precision/choice.py),
           FP8 itself (on where the GPU runs it and a layer of the model, built on "meta" for its shapes, passes the
           filter), the compile mode and wrapper (compiled.py) and the data-parallel mode (parallel/wrap.py) ->
           refuse what this machine cannot run (FP8, its batch shape, the attention kernel, a --parallel mode) -> a Plan
    build: build the model, seeded -> move it to its device and dtype -> convert it as planned -> count the FP8
           modules -> a Built

Nothing after plan decides again: the Trainer compiles in the planned mode and scope, and parallelizes by the planned
mode. Compilation and parallelization themselves are not here: the Trainer wraps the converted model (DDP, FSDP2),
then compiles. The plan decides the parallel mode all the same, because FP8 conversion depends on it (FSDP2
all-gathers FP8 weights, which torchao must be told when it converts). A comparison of BF16 and FP8 builds twins from
one plan: `build(plan)` and `build(plan.with_fp8(False))` start from the same seeded weights.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from cs336_basics.compiled import (
    resolve_compile_mode,
    resolve_compile_scope,
    resolve_compile_wrapper,
    runs_cuda_graphs,
)
from cs336_basics.config import ModelConfig, RunConfig, TrainConfig, reads_base
from cs336_basics.errors import ConfigError
from cs336_basics.lora import LoRAReport, check_finetune_request, load_base
from cs336_basics.model import TransformerLM, check_attention_backend
from cs336_basics.parallel.world import SINGLE, World, current_world, process_device
from cs336_basics.parallel.wrap import (
    FSDP,
    NONE,
    SINGLE_PROCESS,
    ParallelPlan,
    resolve_parallel,
)
from cs336_basics.precision import (
    NO_CONVERSION,
    Converter,
    FP8ConversionReport,
    FP8Support,
    check_fp8_support,
    check_fp8_tokens,
    choose_fp8,
    require_fp8,
    require_fp8_gpu,
    run_converter,
    skip_reason,
)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def torch_dtype(name: str) -> torch.dtype:
    return _DTYPES[name]


@dataclass(frozen=True)
class Plan:
    """What was decided before any model exists: every setting of `config` concrete (no "auto" left)."""

    config: RunConfig
    device: torch.device
    fp8_support: FP8Support
    attention_kernel: str
    auto_choices: tuple[str, ...] = ()
    world: World = SINGLE  # this process's place in a torchrun launch
    parallel: ParallelPlan = SINGLE_PROCESS
    request: RunConfig | None = None  # the config as asked, which with_fp8 plans again

    def with_fp8(self, use_fp8: bool) -> Plan:
        """The plan of the same request with FP8 on or off: its twin, from the same seeded weights. Planned again,
        as the FP8 setting moves the automatic choices that follow from it (the compile mode, the FP8 settings)."""
        return plan((self.request or self.config).with_fp8(use_fp8))


def _check_fp8_request(config: RunConfig, support: FP8Support) -> None:
    if not config.finetune.lora:
        require_fp8(config.fp8, support)
    elif support.device_type == "cuda":  # a frozen LoRA base runs torch._scaled_mm itself: no torchao, no emulation
        require_fp8_gpu(support, emulation=False)  # (and on the CPU, torch's CPU kernel: slow, for tests)
    if config.train.dtype != "bfloat16":
        raise ConfigError(
            f"FP8 training converts a BF16 model; --dtype {config.train.dtype} was asked for. "
            "Use --dtype bfloat16 (or auto), or run without --use_fp8."
        )
    check_fp8_tokens(config.train.batch_size, config.model.context_length, config.fp8)


def check_cuda_graphs_request(train: TrainConfig, device: torch.device, parallel_mode: str = NONE) -> None:
    """Refuse CUDA graphs with gradient accumulation under FSDP2. In one process, and under DDP, the Trainer sums the
    micro-batches' gradients outside the graphs' memory (training/accumulation.py), where a replay would otherwise
    overwrite them (pytorch/pytorch#169545), and under DDP averages the sums over the ranks after the last; FSDP2
    reduce-scatters each micro-batch's gradients from inside backward, which that design does not cover."""
    graphs = runs_cuda_graphs(train.compile_model, train.compile_mode, device)
    if graphs and train.gradient_accumulation_steps > 1 and parallel_mode == FSDP:
        raise ConfigError(
            f"--compile_mode {train.compile_mode} runs the step under CUDA graphs, whose gradient accumulation is "
            f"supported in one process and under DDP, so --gradient_accumulation_steps "
            f"{train.gradient_accumulation_steps} under FSDP2 cannot be honoured. Use --compile_mode default (or "
            "max-autotune-no-cudagraphs) with gradient accumulation under FSDP2, --parallel ddp, or "
            "--gradient_accumulation_steps 1 with a larger --batch_size."
        )


def plan(config: RunConfig) -> Plan:
    """Resolve every "auto" setting for this machine and refuse, with the fix, what it cannot run. Builds nothing
    but the model's modules on "meta" (its shapes and parameter count, no memory)."""
    request = config
    t, o, fp8 = config.train, config.optim, config.fp8
    world = current_world()
    device = process_device(t.device, world)  # under torchrun: this rank's GPU
    auto: list[str] = []
    support = check_fp8_support(device)
    use_fp8 = fp8.use_fp8
    if use_fp8 is None and not support.ok:
        use_fp8 = False
        auto.append(f"use_fp8=False ({support.reason})")
    dtype = t.dtype
    if dtype == "auto":
        # FP8 conversion and the fast tensor-core path want BF16 weights; on CPU float32 is faster and exact.
        dtype = "bfloat16" if device.type == "cuda" or use_fp8 else "float32"
        auto.append(f"dtype={dtype}")
    compile_model = t.compile_model
    if compile_model is None:
        compile_model = device.type == "cuda"
        auto.append(f"compile_model={compile_model}")
    # Fixed here, at the run's start, and saved with it: a resumed run that raises max_steps keeps this schedule.
    decay = o.lr_decay_steps if o.lr_decay_steps is not None else t.max_steps
    # Under torchrun the saved config names the device type only: it is the same file for every rank.
    device_setting = device.type if world.launched else str(device)
    config = config.replace(
        train={"device": device_setting, "dtype": dtype, "compile_model": compile_model},
        fp8={"use_fp8": use_fp8},
        optim={"lr_decay_steps": decay},
    )
    if config.model.hf_model is not None:
        from cs336_basics.hf.models import check_hf_model_request

        check_hf_model_request(config, world.launched)
    shapes = shape_model(config.model)
    n_params = shapes.num_parameters()
    parallel_mode = _parallel_mode(config, world, device, n_params)
    scope, why = resolve_compile_scope(t.compile_scope, config.model.hf_model is None, parallel_mode == FSDP)
    if compile_model and t.compile_scope == "auto":
        auto.append(f"compile_scope={scope} ({why})")
    config = config.replace(train={"compile_scope": scope})
    # The FP8 settings depend on whether an FP8 step will replay under CUDA graphs: the mode an FP8 step would get.
    fp8_mode, _ = resolve_compile_mode(config.train, True, device, parallel_mode)
    choice = choose_fp8(
        config.fp8,
        world_size=world.world_size,
        lora=config.finetune.lora,
        own_model=config.model.hf_model is None,
        cuda_graphs=runs_cuda_graphs(compile_model, fp8_mode, device),
    )
    config = dataclasses.replace(config, fp8=choice.config)
    if use_fp8 is not False:
        auto += choice.notes
    if use_fp8 is None:  # automatic, on a GPU that runs FP8: on if at least one layer is worth converting
        use_fp8 = any(skip_reason(module, fqn, config.fp8) is None for fqn, module in shapes.named_modules())
        auto.append("use_fp8=True" if use_fp8 else "use_fp8=False (no layer passes the FP8 filter)")
        config = config.with_fp8(use_fp8)
    if use_fp8:
        _check_fp8_request(config, support)
    if t.compile_mode == "auto":
        mode, why = resolve_compile_mode(config.train, use_fp8, device, parallel_mode)
        auto.append(f"compile_mode={mode} ({why})")
        config = config.replace(train={"compile_mode": mode})
    fp8_path = config.fp8.fp8_path if use_fp8 else None
    wrapper, why = resolve_compile_wrapper(config.train, device, world, parallel_mode, fp8_path)
    if t.compile_wrapper == "auto":
        auto.append(f"compile_wrapper={wrapper} ({why})")
    config = config.replace(train={"compile_wrapper": wrapper})
    parallel = resolve_parallel(config, world, device, n_params)
    check_finetune_request(config, world)
    check_cuda_graphs_request(config.train, device, parallel.mode)
    m = config.model
    kernel = check_attention_backend(m.attention, device, torch_dtype(dtype), head_dim=m.head_dim)
    return Plan(config, device, support, kernel, tuple(auto), world, parallel, request)


def shape_model(model: ModelConfig) -> torch.nn.Module:
    """The model's modules on the "meta" device: their shapes, names and parameter count, with no memory and no
    initialisation, for the decisions plan() makes before anything is built."""
    if model.hf_model is not None:
        return new_model(model, "meta")
    with torch.device("meta"):
        return TransformerLM(model)


def _parallel_mode(config: RunConfig, world: World, device: torch.device, n_params: int) -> str:
    """The data-parallel mode (it changes the FP8 path's default): none in one process, the one asked for, or for
    auto the one resolve_parallel picks from the parameter count."""
    if not world.launched:
        return NONE
    if config.train.parallel != "auto":
        return config.train.parallel
    return resolve_parallel(config, world, device, n_params).mode


@dataclass
class Built:
    """A model ready for the Trainer (which compiles it), and what was decided on the way."""

    plan: Plan
    config: RunConfig  # every setting concrete, use_fp8 included
    model: torch.nn.Module  # TransformerLM, or a Hugging Face model behind its forward (hf.models.CausalLM)
    conversion: FP8ConversionReport | None  # None without FP8
    fp8_linears: int  # FP8 linears counted in the model after conversion, independently of the conversion's report
    auto_choices: tuple[str, ...]
    parallel: ParallelPlan = SINGLE_PROCESS
    lora: LoRAReport | None = None  # a LoRA fine-tune: which base layers are FP8, which carry adapters
    converter: Converter = NO_CONVERSION  # what converted the model; the Trainer calls its step hooks

    @property
    def device(self) -> torch.device:
        return self.plan.device

    @property
    def fp8_line(self) -> str:
        """The FP8 row of the configuration summary."""
        if self.lora is not None:
            if not self.config.fp8.use_fp8:
                return f"off (the frozen base runs in {self.lora.base_dtype})"
            cpu = self.device.type == "cpu"
            where = " (on the CPU too: torch._scaled_mm's CPU kernel, not emulation)" if cpu else ""
            return (
                f"frozen base, tensorwise{where}; this package's frozen FP8 linears (lora/layers.py) whatever "
                f"--fp8_path says; {self.fp8_linears} FP8 linears counted"
            )
        if self.conversion is None:
            return "off"
        return f"{self.conversion.summary_line()}; {self.fp8_linears} FP8 linears counted"

    @property
    def finetune_rows(self) -> list[tuple[str, str]]:
        """The fine-tuning rows of the configuration summary (none for pretraining)."""
        ft = self.config.finetune
        if ft.init_from is None:
            return []
        base = f" (weights SHA-256 {ft.base_sha256[:12]}...)" if ft.base_sha256 else ""
        whole = "" if ft.lora else " (full fine-tuning: every weight trains)"
        rows = [("init from", f"{ft.init_from}{base}{whole}")]
        return rows + (self.lora.summary_lines() if self.lora is not None else [])


def new_model(model: ModelConfig, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
              seed: int = 0) -> torch.nn.Module:  # fmt: skip
    """The model a model config describes, TransformerLM or the Hugging Face causal LM --hf_model names, initialised
    from `seed` on `device` in `dtype`."""
    if model.hf_model is not None:
        from cs336_basics.hf.models import build_causal_lm, hf_config

        return build_causal_lm(hf_config(model.hf_model), device, dtype, seed)
    torch.manual_seed(seed)
    return TransformerLM(model).to(device=device, dtype=dtype)


def seeded_model(config: RunConfig, device: torch.device) -> torch.nn.Module:
    """config's model on `device` in its training dtype. Seeded, so twins (a BF16 and an FP8 build of one
    comparison) start from the same weights."""
    return new_model(config.model, device, torch_dtype(config.train.dtype), config.train.seed)


def build(config_or_plan: RunConfig | Plan) -> Built:
    """Plan (if given a config), then build the model, convert it as planned and count the FP8 modules. Decides
    nothing (plan did). Raises ConfigError with the fix for anything that cannot run; nothing has been trained or
    written when it does."""
    p = plan(config_or_plan) if isinstance(config_or_plan, RunConfig) else config_or_plan
    config, use_fp8 = p.config, bool(p.config.fp8.use_fp8)
    model = seeded_model(config, p.device)
    ft = config.finetune
    if reads_base(ft.init_from, ft.lora_rank, config.train.resume):
        _, sha256 = load_base(model, ft.init_from, ft.base_sha256 if ft.lora else None)
        if ft.lora:  # adapters belong to these weights: saved with the run, checked on resume and merge
            config = config.replace(finetune={"base_sha256": sha256})
    converter = run_converter(config, p.parallel.world.world_size, fsdp_float8_all_gather=p.parallel.fp8_all_gather)
    report = converter.convert(model)
    lora = report if isinstance(report, LoRAReport) else None
    fp8_report = converter.fp8_report(report)  # None without FP8
    counted = converter.count(model)  # the independent check of the report
    expected = fp8_report.n_converted if fp8_report else 0
    if counted != expected or (use_fp8 and counted == 0):
        raise ConfigError(
            f"FP8 was requested but {counted} FP8 linears are in the model after conversion ({expected} expected)."
        )
    return Built(
        plan=p,
        config=config,
        model=model,
        conversion=None if lora else report,
        fp8_linears=counted,
        auto_choices=p.auto_choices,
        parallel=p.parallel,
        lora=lora,
        converter=converter,
    )
