"""The FINAL CONFIGURATION SUMMARY printed before training, with a verdict: optimal, or each sub-optimal
choice named with what to do about it."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from cs336_basics.config import PRESETS, RunConfig
from cs336_basics.optim import fused_by_default, min_lr_from
from cs336_basics.parallel.wrap import SINGLE_PROCESS, ParallelPlan


@dataclass
class RunFacts:
    """What was decided for this run, beyond the config itself."""

    device: torch.device
    total_params: int
    non_embedding_params: int
    attention_kernel: str
    data_description: str
    auto_choices: list[str] = field(default_factory=list)
    fp8_line: str = "off"
    fp8_capable: bool = False
    resume_notes: list[str] = field(default_factory=list)
    parallel: ParallelPlan = SINGLE_PROCESS
    finetune_rows: list[tuple[str, str]] = field(default_factory=list)  # init_from, LoRA layers and parameters


# How much slower: INDEX.md: 2026-11-21-sweep-fused-adamw-h200, its sweep.md (the eager rows).
FP8_EAGER_WARNING = (
    "FP8 WITHOUT torch.compile: torchao's scaling and casting then run as separate unfused kernels, and FP8 eager "
    "is far slower than compiled BF16 (and than eager BF16). Add --compile_model."
)


def _device_line(device: torch.device) -> str:
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"{device} ({torch.cuda.get_device_name(device)}, sm_{major}{minor})"
    return f"cpu ({torch.get_num_threads()} threads)"


def suboptimal_choices(config: RunConfig, facts: RunFacts) -> list[str]:
    t, m = config.train, config.model
    if facts.device.type != "cuda":
        return [
            "running on CPU: good for a quick, correct check only. Training speed, BF16 tensor cores and the "
            "real FP8 path need an H100-class GPU (compute capability 8.9 or newer) with CUDA."
        ]
    warnings = []
    fp8 = config.fp8
    if fp8.use_fp8 and not t.compile_model:
        warnings.append(FP8_EAGER_WARNING)
    elif not t.compile_model:
        warnings.append("torch.compile is off: eager mode leaves kernel fusion on the table; add --compile_model.")
    if fp8.use_fp8 and fp8.fp8_emulate:
        warnings.append("--fp8_emulate runs FP8 numerics in high precision: slower than BF16; for debugging only.")
    if not fp8.use_fp8 and facts.fp8_capable:
        warnings.append("FP8 is off on a GPU that supports it: add --use_fp8 (FP8 training).")
    if t.dtype != "bfloat16":
        warnings.append(f"{t.dtype} weights on a GPU: BF16 tensor cores go unused; use --dtype bfloat16.")
    if m.attention == "math":
        warnings.append("math attention builds the full score matrix; use --attention sdpa or flash.")
    if m.gradient_checkpointing:
        warnings.append(
            "activation checkpointing recomputes each block's forward (about a third more compute); keep it "
            "only if the batch does not fit otherwise (--no_gradient_checkpointing)."
        )
    return warnings


def _batch_and_parallel_rows(config: RunConfig, par: ParallelPlan) -> list[tuple[str, str]]:
    """The parallel rows, then the batch row. Under torchrun: the mode and why, and the global batch over every rank.
    One process: no parallel row, unless flags of a mode it does not run were asked for, or the run was started in
    one (a resume of a DDP or FSDP2 run)."""
    t, m = config.train, config.model
    world = par.world.world_size
    tokens = t.batch_size * m.context_length * t.gradient_accumulation_steps
    if par.world.launched:
        batch_row = (
            "global batch",
            f"{t.batch_size} x {m.context_length} x {t.gradient_accumulation_steps} accumulation x {world} processes "
            f"= {tokens * world:,} tokens per step",
        )
        return [("parallel", par.summary_line()), ("per-GPU memory", par.memory_line()), batch_row]
    batch_row = (
        "tokens per step",
        f"{t.batch_size} x {m.context_length} x {t.gradient_accumulation_steps} accumulation = {tokens:,}",
    )
    shown = par.unused_flags or config.train.parallel != "auto"
    return [("parallel", par.summary_line()), batch_row] if shown else [batch_row]


def _model_line(config: RunConfig) -> str:
    m = config.model
    if m.hf_model:
        whose = f"Hugging Face {m.hf_model} (transformers, random weights)"
    else:  # the preset's shape, or the one that flags, a --config file or a fine-tune's base gave in its place
        changed = [name for name, value in PRESETS[config.preset]["model"].items() if getattr(m, name) != value]
        whose = f"preset {config.preset}" + (f" with its {', '.join(changed)} changed" if changed else "")
    return (
        f"{whose}: dim {m.dim}, {m.n_layers} layers, {m.n_heads} heads (kv {m.kv_heads}), "
        f"ffn {m.intermediate_size}, vocab {m.vocab_size}, context {m.context_length}"
        + (", tied embeddings" if m.tie_embeddings else "")
    )


def _precision_line(config: RunConfig, device: torch.device) -> str:
    t = config.train
    return (
        f"{t.dtype} weights"
        + (", fp32 master weights and AdamW moments" if t.dtype != "float32" else ", fp32 AdamW")
        + (" (fused Triton update)" if fused_by_default(device) else "")
    )


def _compile_line(config: RunConfig, par: ParallelPlan) -> str:
    t = config.train
    if not t.compile_model:
        return "off (eager)"
    if t.compile_scope == "model":
        scope = "the whole model"
    else:
        scope = "per block (one graph for all blocks), the embedding and the output apart"
    wrapper = ", C++ wrapper" if t.compile_wrapper == "cpp" else ""
    return f"on (mode {t.compile_mode}, fullgraph, {scope}{wrapper})"


def _optimizer_line(config: RunConfig) -> str:
    o = config.optim
    line = (
        f"AdamW lr {o.lr:g} -> {o.min_lr:g} cosine (warmup {o.warmup_steps}, min_lr from step "
        f"{min_lr_from(o.warmup_steps, o.lr_decay_steps)}), weight decay {o.weight_decay:g}, clip {o.max_grad_norm:g}"
    )
    if o.warmup_steps > o.lr_decay_steps:
        line += (
            f"; the warmup outlasts the cosine ({o.lr_decay_steps} steps): the rate climbs until step "
            f"{o.warmup_steps}, then drops straight to min_lr. Lower --warmup_steps or raise --lr_decay_steps"
        )
    elif o.lr_decay_steps < config.train.max_steps and not config.train.resume:  # a resume's notes say it
        line += (
            f"; the cosine ends at step {o.lr_decay_steps} of {config.train.max_steps} (--lr_decay_steps, perhaps "
            "from a --config file): the rest runs at min_lr"
        )
    return line


def _output_line(config: RunConfig) -> str:
    t = config.train
    return t.out_dir + (" (resuming)" if t.resume else " (replacing the earlier run)" if t.overwrite else "")


def _summary_rows(config: RunConfig, facts: RunFacts) -> list[tuple[str, str]]:
    """The summary's (label, value) rows, in the order printed."""
    t, m = config.train, config.model
    return [
        ("device", _device_line(facts.device)),
        ("model", _model_line(config)),
        ("parameters", f"{facts.total_params:,} total, {facts.non_embedding_params:,} without the token embedding"),
        ("precision", _precision_line(config, facts.device)),
        ("FP8", facts.fp8_line),
        *facts.finetune_rows,
        ("compile", _compile_line(config, facts.parallel)),
        ("attention", f"{m.attention}: {facts.attention_kernel}"),
        ("activation ckpt", "on" if m.gradient_checkpointing else "off"),
        *_batch_and_parallel_rows(config, facts.parallel),
        ("steps", f"{t.max_steps}, eval every {t.eval_every}, checkpoint every {t.checkpoint_every}"),
        ("optimizer", _optimizer_line(config)),
        ("data", facts.data_description),
        ("output", _output_line(config)),
        *(("resume", note) for note in facts.resume_notes),
        ("auto-selected", ", ".join(facts.auto_choices) or "none"),
    ]


def _verdict_lines(config: RunConfig, facts: RunFacts) -> list[str]:
    """Each sub-optimal choice with what to do about it, or, with none, the optimal verdict."""
    warnings = suboptimal_choices(config, facts)
    if warnings:
        return ["SUB-OPTIMAL CONFIGURATION:", *(f"  - {w}" for w in warnings)]
    return [f"OPTIMAL CONFIGURATION: {verdict(config, facts)}"]


def format_summary(config: RunConfig, facts: RunFacts) -> str:
    rows = _summary_rows(config, facts)
    width = max(len(k) for k, _ in rows)
    bar = "=" * 78
    lines = [bar, "FINAL CONFIGURATION SUMMARY", bar]
    lines += [f"  {k:<{width}}  {v}" for k, v in rows]
    lines.append(bar)
    lines += _verdict_lines(config, facts)
    lines.append(bar)
    return "\n".join(lines)


def verdict(config: RunConfig, facts: RunFacts) -> str:
    # Only claimed when conversion really produced Float8 modules (the caller refuses FP8 with none).
    return "FP8 + Compilation" if config.fp8.use_fp8 else "BF16 + Compilation"
