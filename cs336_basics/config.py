"""One config tree for the model, data, optimiser, training loop and FP8.

Values resolve in one order everywhere: command line > config file (JSON) > preset > field default.
The tree is saved with every checkpoint, so a run can always be reproduced from its output folder.

Each field is declared once, with its help text, its allowed choices and its range check (`setting`): the
command line (cli.py) reads its flags from here, and every config, whatever it came from (flags, a JSON file, a
preset, code), is checked against the same rules when it is built, so a bad value is one clear error up front.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cs336_basics.errors import ConfigError

ATTENTION_BACKENDS = ("sdpa", "flash", "math")
DATASETS = ("stdlib", "tinystories")
DTYPES = ("auto", "bfloat16", "float32")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
COMPILE_SCOPES = ("auto", "blocks", "model")
COMPILE_WRAPPERS = ("auto", "python", "cpp")
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")  # the modes that run the compiled step under CUDA graphs
FP8_RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")
FP8_FORMATS = ("auto", "e4m3", "hybrid")
FP8_PATHS = ("auto", "fused", "torchao", "accelerate")
# A LoRA fine-tune's frozen base runs its own FP8 linears (lora/layers.py) whichever path is named: its name in records.
LORA_FP8_PATH = "lora-frozen"
FP8_SCALINGS = ("auto", "dynamic", "delayed")
FP8_AMAX_ALGOS = ("max", "most_recent")
PARALLEL_MODES = ("auto", "ddp", "fsdp")

# The optimizer keeps the learning rate in a float32 device tensor: a larger value would become inf there.
FLOAT32_MAX = 3.4028234663852886e38

Check = Callable[[Any], str | None]  # value -> what is wrong with it, or None


def setting(
    default: Any,
    help: str = "",
    *,
    choices: tuple[str, ...] | None = None,
    check: Check | None = None,
    only_on: str | None = None,
):
    """A config field with its help text, its allowed choices and its range check, declared in one place.
    `only_on`: the one FP8 path ("fused" or "torchao") that has this setting: --help lists it under that path, and
    a value other than the default names that path (FP8Config.implied_path)."""
    return field(default=default, metadata={"help": help, "choices": choices, "check": check, "only_on": only_on})


def at_least(low: int) -> Check:
    return lambda v: None if v >= low else f"must be >= {low}"


def seed_value(v: int) -> str | None:
    """A random seed torch takes (an unsigned 64-bit number)."""
    return None if 0 <= v < 2**64 else "must be in [0, 2**64)"


def positive(v: float) -> str | None:
    return None if v > 0 else "must be > 0"


def non_negative(v: float) -> str | None:
    return None if v >= 0 else "must be >= 0"


def finite(check: Check) -> Check:
    return lambda v: "must be a finite number" if not math.isfinite(v) else check(v)


def unit_interval(v: float) -> str | None:
    return None if 0 <= v < 1 else "must be in [0, 1)"


def not_empty(v: str) -> str | None:
    return None if v.strip() else "must not be empty"


def learning_rate(v: float) -> str | None:
    return None if 0 < v <= FLOAT32_MAX else f"must be > 0 and at most {FLOAT32_MAX:.3g} (float32's largest value)"


_TYPE_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _checked_value(name: str, value: Any, hint: Any) -> Any:
    """`value` if it has the field's type (int accepted for float, returned as float); else a ConfigError."""
    allowed = typing.get_args(hint) or (hint,)
    if value is None:
        if type(None) in allowed:
            return None
        raise ConfigError(f"{name} must be {_TYPE_WORDS[allowed[0]]}, got null.")
    kind = next(t for t in allowed if t is not type(None))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    # bool is a subclass of int, so isinstance alone would take `true` for an integer.
    if type(value) is not kind:
        raise ConfigError(f"{name} must be {_TYPE_WORDS[kind]}, got {value!r} ({type(value).__name__}).")
    if kind is float and math.isnan(value):
        raise ConfigError(f"{name} must be a number, got nan.")
    return value


def _flag(name: str, value: Any) -> str:
    """The command-line flag that sets `name` to `value`."""
    if isinstance(value, bool):
        return f"--{name}" if value else f"--no_{name}"
    return f"--{name} {value}"


def validate_fields(obj: Any) -> None:
    """Check every field of a config dataclass against its declared type, choices and range."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = _checked_value(f.name, getattr(obj, f.name), hints[f.name])
        object.__setattr__(obj, f.name, value)  # the frozen dataclass keeps the normalised value
        problem = field_problem(f, value) if value is not None else None
        if problem:
            raise ConfigError(f"{f.name} {problem}; got {value!r}.")


def field_problem(f: dataclasses.Field, value: Any) -> str | None:
    """What is wrong with `value` (of the field's type) for config field `f`: off its choices or its range; None if
    nothing."""
    choices, check = f.metadata.get("choices"), f.metadata.get("check")
    if choices and value not in choices:
        return f"must be one of {', '.join(map(str, choices))}"
    return check(value) if check else None


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = setting(32000, "vocabulary size: token ids are 0 .. vocab_size-1", check=at_least(1))
    context_length: int = setting(2048, "tokens per training sequence", check=at_least(1))
    dim: int = setting(896, "model width d_model", check=at_least(1))
    n_layers: int = setting(24, "transformer blocks", check=at_least(1))
    n_heads: int = setting(14, "query heads", check=at_least(1))
    n_kv_heads: int | None = setting(
        None, "key/value heads for grouped-query attention (default: n_heads)", check=at_least(1)
    )
    intermediate_size: int = setting(3584, "SwiGLU hidden size d_ff", check=at_least(1))
    rope_theta: float = setting(10000.0, "RoPE base", check=finite(positive))
    norm_eps: float = setting(1e-5, "RMSNorm epsilon", check=finite(positive))
    tie_embeddings: bool = setting(False, "share the token embedding matrix with the lm_head")
    attention: str = setting(
        "sdpa", "attention kernel: sdpa, flash, or math (the reference)", choices=ATTENTION_BACKENDS
    )
    gradient_checkpointing: bool = setting(
        False, "recompute each block's activations in backward: less memory, about a third more compute"
    )
    hf_model: str | None = setting(
        None, "train a Hugging Face causal LM instead of this package's model: a named shape (llama-tiny, "
        "llama-125m, llama-1b), a local directory holding a config.json, or a hub id (its config only); random "
        "weights, its config fixes the shape flags above (the hf extra: uv sync --extra hf)", check=not_empty,
    )  # fmt: skip

    def __post_init__(self) -> None:
        validate_fields(self)
        if self.dim % self.n_heads:
            raise ConfigError(
                f"dim ({self.dim}) must be divisible by n_heads ({self.n_heads}); "
                f"pick n_heads from the divisors of {self.dim}."
            )
        if self.n_heads % self.kv_heads:
            raise ConfigError(
                f"n_heads ({self.n_heads}) must be divisible by n_kv_heads ({self.kv_heads}) "
                "for grouped-query attention."
            )
        if self.head_dim % 2:
            raise ConfigError(
                f"head dimension dim/n_heads = {self.dim}/{self.n_heads} = {self.head_dim} is odd; "
                "RoPE rotates pairs of channels, so it must be even."
            )

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads if self.n_kv_heads is not None else self.n_heads

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


def with_fixed_shape(
    model: dict[str, Any], shape: dict[str, Any], explicit: dict[str, Any], request: str, source: str, fix: str
) -> dict[str, Any]:
    """The model section `model` with the settings `shape` fixes, taken from `source` (e.g. "the base") that
    `request` (e.g. "--init_from DIR") named; ConfigError saying `fix` where a setting given explicitly disagrees."""
    clashes = [f"--{k} {explicit[k]} ({source} has {v})" for k, v in shape.items() if explicit.get(k, v) != v]
    if clashes:
        raise ConfigError(
            f"{request}: the model's shape comes from {source}, and {', '.join(clashes)} disagrees. {fix}"
        )
    return {**model, **shape}


# Model settings that change the function being trained, and so the meaning of a checkpoint's weights. The
# others (attention kernel, activation checkpointing) compute the same function another way.
MODEL_IDENTITY_FIELDS = (
    "vocab_size", "context_length", "dim", "n_layers", "n_heads", "n_kv_heads", "intermediate_size",
    "rope_theta", "norm_eps", "tie_embeddings", "hf_model",
)  # fmt: skip
# The fine-tuning settings that decide which adapters a LoRA model has and what they compute (FinetuneConfig).
LORA_IDENTITY_FIELDS = ("lora_rank", "lora_targets", "lora_alpha")


@dataclass(frozen=True)
class DataConfig:
    dataset: str = setting(
        "stdlib", "built-in corpus: stdlib (the Python standard library's source, offline) or tinystories "
        "(downloaded)", choices=DATASETS,
    )  # fmt: skip
    train_data: str | None = setting(
        None, "your training data: .txt (tokenised with a BPE trained on it, cached) or token array .npy/.bin",
        check=not_empty,
    )  # fmt: skip
    val_data: str | None = setting(
        None, "validation data, same formats (default: the last 5%% of train held out)", check=not_empty
    )
    tokenizer: str | None = setting(
        None, "a saved tokenizer folder (a run folder's tokenizer/) to encode .txt data with, instead of training one "
        "on it; fine-tuning from a run folder uses that run's by default", check=not_empty,
    )  # fmt: skip
    cache_dir: str | None = setting(
        None, "where tokenizers and encoded arrays are cached (default $CS336_CACHE_DIR or ~/.cache/cs336_basics)",
        check=not_empty,
    )  # fmt: skip

    def __post_init__(self) -> None:
        validate_fields(self)


@dataclass(frozen=True)
class OptimConfig:
    lr: float = setting(3e-4, "peak learning rate", check=learning_rate)
    min_lr: float = setting(3e-5, "learning rate at the end of the cosine decay", check=finite(non_negative))
    warmup_steps: int = setting(100, "steps of linear warm-up from 0 to lr", check=at_least(0))
    lr_decay_steps: int | None = setting(
        None, "the step where the cosine reaches min_lr (it stays there after); default max_steps, fixed when a "
        "run starts, so a resumed run with a larger --max_steps keeps its schedule continuous", check=at_least(1),
    )  # fmt: skip
    weight_decay: float = setting(0.1, "decoupled weight decay (matrices only)", check=finite(non_negative))
    beta1: float = setting(0.9, "AdamW beta1", check=unit_interval)
    beta2: float = setting(0.95, "AdamW beta2", check=unit_interval)
    eps: float = setting(1e-8, "AdamW epsilon", check=finite(positive))
    max_grad_norm: float = setting(1.0, "clip the global gradient norm to this (inf: no clipping)", check=positive)

    def __post_init__(self) -> None:
        validate_fields(self)
        if self.min_lr > self.lr:
            raise ConfigError(f"min_lr ({self.min_lr:g}) must not exceed lr ({self.lr:g}).")


@dataclass(frozen=True)
class FP8Config:
    # Field names carry the fp8_ prefix because every config field is also a flat CLI flag.
    use_fp8: bool | None = setting(
        None, "train the linear layers in FP8 (default: on where the GPU runs FP8 matmuls, sm_89+ with torchao)"
    )
    fp8_recipe: str = setting("tensorwise", "TorchAO float8 recipe", choices=FP8_RECIPES)
    fp8_format: str = setting(
        "auto", "auto: the recipe's own (tensorwise: E4M3 forward / E5M2 gradients); hybrid; e4m3 everywhere",
        choices=FP8_FORMATS,
    )  # fmt: skip
    fp8_lm_head: bool | None = setting(
        None, "convert the output projection too (default: on with the fused path, off with TorchAO's)"
    )
    fp8_shape_filter: bool | None = setting(
        None, "convert only layers whose matmul shape is large enough for FP8 to pay (TorchAO's rule; default: on "
        "with TorchAO's path, off with the fused path)",
    )  # fmt: skip
    fp8_emulate: bool = setting(False, "TorchAO's emulation: FP8 numerics in high precision, for CPU tests only")
    fp8_path: str = setting(
        "auto", "fused: this package's FP8 linears (one cast per shared input, FP8 tensors saved for backward, "
        "delayed or dynamic scaling); torchao: TorchAO's Float8Linear; accelerate: the conversion Hugging Face "
        "Accelerate's FP8 (TorchAO backend) makes (the hf extra); auto: the fused path (measured fastest in one "
        "process, under DDP and under FSDP2), TorchAO's where only it runs (precision/choice.py)",
        choices=FP8_PATHS,
    )  # fmt: skip
    fp8_scaling: str = setting(
        "auto", "dynamic: each tensor's scale from its own amax (two passes); delayed: from the amax history of "
        "earlier steps (one pass; --fp8_path fused; on several processes the ranks reduce each step's amaxes); auto: "
        "the path's default (the fused path's: delayed)",
        choices=FP8_SCALINGS,
    )  # fmt: skip
    # The settings below belong to one path (only_on): --help groups them under it.
    fp8_amax_history_len: int = setting(
        16, "delayed scaling: steps of amax history kept", check=at_least(1), only_on="fused"
    )
    fp8_amax_compute_algo: str = setting(
        "max", "delayed scaling: the scale comes from the history's max, or from the most recent amax",
        choices=FP8_AMAX_ALGOS, only_on="fused",
    )  # fmt: skip
    fp8_margin: int = setting(
        0, "delayed scaling: scale = FP8 max / (amax * 2^margin)", check=at_least(0), only_on="fused"
    )
    fp8_share_input_casts: bool = setting(
        True, "cast the input shared by q/k/v (and by w1/w3) once for all of them", only_on="fused"
    )
    fp8_fused_swiglu: bool = setting(
        True, "each SwiGLU block runs as one FP8 unit whose kernels write its activation and the activation's "
        "gradients directly in FP8 (Triton on CUDA), instead of BF16 tensors cast afterwards", only_on="fused",
    )  # fmt: skip
    fp8_fused_rope: bool = setting(
        True, "q/k/v's shared input group also applies RoPE, so one kernel writes q's, k's and v's gradients directly "
        "in FP8 from attention's (RoPE's backward included; Triton on CUDA), instead of BF16 tensors cast afterwards",
        only_on="fused",
    )  # fmt: skip
    fp8_fast_accum_backward: bool | None = setting(
        None, "fast (lower-precision) accumulation in the backward FP8 GEMMs too (the forward GEMM always uses it, as "
        "TorchAO does), except the lm_head's, whose gradient it would ruin (default: on for a LoRA fine-tune's frozen "
        "base, off for pre-training)", only_on="fused",
    )  # fmt: skip
    # Off by default, as in torchtitan: each weight shard is then cast once per all-gather, eagerly, outside the
    # compiled blocks, which on one GPU of FSDP2 cost far more than FP8 saved (docs/several-gpus.md); what it saves,
    # half of each all-gather's bytes, counts on slow links.
    fp8_all_gather: bool = setting(
        False, "under --parallel fsdp (tensorwise): all-gather the weights in FP8, half the bytes of BF16, each "
        "shard cast to FP8 before its all-gather (torchao's enable_fsdp_float8_all_gather); off: BF16 all-gather, "
        "the weights cast to FP8 inside the compiled blocks", only_on="torchao",
    )  # fmt: skip

    def only_flags(self, path: str) -> list[str]:
        """The settings given that only `path` ("fused" or "torchao") has, as flags. A switch whose default is None
        (each path's defaults choose it) names its path only when on: off is what the paths without it do. That
        keeps run folders saved when its default was off (fp8_fast_accum_backward) resumable on TorchAO's path."""
        flags = [
            _flag(f.name, value)
            for f in dataclasses.fields(self)
            if f.metadata.get("only_on") == path
            and (value := getattr(self, f.name)) != f.default
            and not (f.default is None and value is False)
        ]
        if path == "fused" and self.fp8_scaling == "delayed":  # a value of a setting both paths have
            flags.insert(0, "--fp8_scaling delayed")
        if path == "torchao" and self.fp8_recipe != "tensorwise":
            flags.insert(0, f"--fp8_recipe {self.fp8_recipe}")
        return flags

    def implied_path(self) -> tuple[str, list[str]] | None:
        """The path that settings only one path has name (and those settings), or None; both: ConfigError."""
        fused_only, torchao_only = self.only_flags("fused"), self.only_flags("torchao")
        if fused_only and torchao_only:
            raise ConfigError(
                f"{', '.join(fused_only)} needs the fused FP8 path and {', '.join(torchao_only)} TorchAO's; drop "
                "one of them (or name the path with --fp8_path)."
            )
        if fused_only:
            return "fused", fused_only
        return ("torchao", torchao_only) if torchao_only else None

    def __post_init__(self) -> None:
        # Which options a path takes is that path's rule (precision/: each converter's check_options), applied
        # once the path is chosen (precision/choice.py).
        validate_fields(self)


@dataclass(frozen=True)
class TrainConfig:
    batch_size: int = setting(8, "sequences per micro-batch", check=at_least(1))
    gradient_accumulation_steps: int = setting(1, "micro-batches per optimizer step", check=at_least(1))
    max_steps: int = setting(1000, "optimizer steps to train for", check=at_least(1))
    device: str = setting("auto", "auto, cpu, cuda or cuda:N", check=not_empty)
    dtype: str = setting("auto", "weight dtype: auto (bfloat16 on CUDA, float32 on CPU)", choices=DTYPES)
    compile_model: bool | None = setting(None, "torch.compile the model (default: on for CUDA, off for CPU)")
    compile_mode: str = setting(
        "auto",
        "torch.compile mode; auto: reduce-overhead (CUDA graphs) for an FP8 step in one process and under DDP (with "
        "gradient accumulation too) and under FSDP2 (without), default otherwise (compiled.auto_compile_mode says why)",
        choices=("auto", *COMPILE_MODES),
    )
    compile_scope: str = setting(
        "auto",
        "what one compiled graph holds; blocks: each transformer block (one graph shared by all), the embedding and "
        "the output apart, compiled several times faster; model: the whole model, a little faster per step after a "
        "longer compile (README, Compile and attention); auto: blocks for this package's model, model for a Hugging "
        "Face one",
        choices=COMPILE_SCOPES,
    )
    compile_wrapper: str = setting(
        "auto",
        "the code inductor writes to launch a compiled region's kernels; cpp: C++, less host time per launch after a "
        "longer first compile; python; auto: cpp on a GPU without CUDA graphs for one process and for the fused FP8 "
        "path under FSDP2 (the step waits for its launches), python under CUDA graphs, on CPU and in the rest of "
        "torchrun's runs (compiled.auto_compile_wrapper says why)",
        choices=COMPILE_WRAPPERS,
    )
    seed: int = setting(0, "seed for the initial weights and the order of batches", check=seed_value)
    out_dir: str = setting("runs/default", "the run folder (config, metrics, plot, checkpoint)", check=not_empty)
    resume: bool = setting(False, "continue the run in out_dir from its checkpoint, exactly where it stopped")
    overwrite: bool = setting(False, "start afresh in an out_dir that holds an earlier run, deleting that run")
    log_every: int = setting(10, "steps between metrics records", check=at_least(1))
    eval_every: int = setting(200, "steps between validation evaluations (0: none)", check=at_least(0))
    eval_batches: int = setting(8, "batches per validation evaluation", check=at_least(1))
    checkpoint_every: int = setting(
        500, "steps between checkpoints; one is also written at the end and on a stop signal (0: none at all)",
        check=at_least(0),
    )  # fmt: skip
    # Kept as asked ("auto" stays "auto" in config.json): a run resumed at another world size decides again.
    parallel: str = setting(
        "auto", "under torchrun: ddp (replicated model, gradients all-reduced) or fsdp (FSDP2: parameters, gradients "
        "and optimizer state sharded); auto: none on one process, ddp on several unless the model would not fit",
        choices=PARALLEL_MODES,
    )  # fmt: skip
    ddp_bucket_mb: int = setting(
        25, "under --parallel ddp: megabytes of gradients per all-reduce bucket (torch's default is 25); larger "
        "buckets mean fewer all-reduces and fewer pieces of the compiled graph, smaller ones an earlier start",
        check=at_least(1),
    )  # fmt: skip
    # Kept as asked ("auto" stays None in config.json): a run resumed under another compile mode decides again.
    fsdp_reshard_after_forward: bool | None = setting(
        None, "under --parallel fsdp: free each block's gathered weights after its forward and gather them again "
        "for its backward (least memory); off: keep them from forward to backward, one all-gather per block per "
        "step for about one more unsharded copy of the weights per GPU. The last block keeps them either way (its "
        "backward comes right after its forward). Default: off under CUDA graphs, where the gathered weights stay "
        "allocated anyway (so gathering them again would free nothing), on otherwise",
    )  # fmt: skip
    fsdp_blocks_per_unit: int = setting(
        2, "under --parallel fsdp: consecutive transformer blocks sharded as one FSDP2 unit (one all-gather and one "
        "reduce-scatter for them all, and one set of FSDP2's hooks): fewer, larger collectives and less host work a "
        "step, for up to this many blocks' gathered weights at a time. 2: FSDP2's step at small batches waits for "
        "the slowest rank's host, and halving its hooks sped up every FSDP2 run measured "
        "(INDEX.md: 2026-11-28-fsdp2-units-x4-4xh200, 2026-11-28-fsdp2-units-merge-h200)",
        check=at_least(1),
    )  # fmt: skip
    dist_timeout_s: int = setting(
        600, "under torchrun: seconds a rank waits for the others in a collective before the run fails (a rank "
        "that is stuck or gone never leaves the others hanging)", check=at_least(1),
    )  # fmt: skip

    def __post_init__(self) -> None:
        validate_fields(self)
        if self.resume and self.overwrite:
            raise ConfigError("--resume continues the run in out_dir and --overwrite deletes it: pass one of them.")


# --lora_targets names -> the last part of that linear's name in the model (attention, SwiGLU, output head).
LORA_TARGET_MODULES = {
    "q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "output_proj", "w1": "w1", "w2": "w2", "w3": "w3",
    "lm_head": "lm_head",
}  # fmt: skip
LORA_TARGETS = tuple(LORA_TARGET_MODULES)
LORA_SHORTHANDS = {"attn": ("q", "k", "v", "o"), "mlp": ("w1", "w2", "w3"), "all": LORA_TARGETS[:-1]}


def lora_target_list(value: str) -> tuple[str, ...]:
    """--lora_targets as layer names, shorthands expanded, in LORA_TARGETS order; a ConfigError for an unknown one."""
    names: set[str] = set()
    for part in (p.strip() for p in value.split(",")):
        if part in LORA_SHORTHANDS:
            names.update(LORA_SHORTHANDS[part])
        elif part in LORA_TARGETS:
            names.add(part)
        else:
            shorthands = ", ".join(f"{name} ({'+'.join(layers)})" for name, layers in LORA_SHORTHANDS.items())
            raise ConfigError(
                f"--lora_targets: {part!r} is not a layer of this model; use any of {', '.join(LORA_TARGETS)} or the "
                f"shorthands {shorthands}, comma-separated."
            )
    return tuple(t for t in LORA_TARGETS if t in names)


def reads_base(init_from: str | None, lora_rank: int | None, resume: bool) -> bool:
    """Whether a run reads its --init_from base: a LoRA run always (its frozen weights are the base's, checked by
    SHA-256), a full fine-tune only when it starts (its checkpoint then holds every weight, and its config.json the
    base's shape)."""
    return init_from is not None and (lora_rank is not None or not resume)


@dataclass(frozen=True)
class FinetuneConfig:
    init_from: str | None = setting(
        None, "start from these weights: a run folder, a checkpoint.pt, or a course-layout state dict (.pt); the "
        "model's shape comes from it. Alone: full fine-tuning; with --lora_rank: LoRA on the frozen base",
        check=not_empty,
    )  # fmt: skip
    lora_rank: int | None = setting(
        None, "rank of the LoRA adapters (default: no LoRA; with --init_from alone every weight trains); needs "
        "--init_from", check=at_least(1),
    )  # fmt: skip
    lora_alpha: float | None = setting(
        None, "LoRA scale numerator: adapters add (alpha / rank) * B A x (default: alpha = rank, a scale of 1)",
        check=finite(positive),
    )  # fmt: skip
    lora_dropout: float = setting(0.0, "dropout on the adapters' input", check=unit_interval)
    lora_targets: str = setting(
        "attn", f"layers that get adapters: any of {', '.join(LORA_TARGETS)}, or attn, mlp, all (all linears but "
        "lm_head), comma-separated", check=not_empty,
    )  # fmt: skip
    base_sha256: str | None = setting(
        None, "SHA-256 of the base's weights that a LoRA run's adapters belong to: set when the run starts and saved "
        "with it, so that a resume or a merge stops if --init_from has changed since (pass it to pin a base)",
        check=lambda v: None if len(v) == 64 and all(c in "0123456789abcdef" for c in v) else "must be 64 hex digits",
    )  # fmt: skip

    def __post_init__(self) -> None:
        validate_fields(self)
        lora_target_list(self.lora_targets)
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        unused = [f"--{name}" for name in ("lora_alpha", "lora_dropout", "lora_targets", "base_sha256")
                  if getattr(self, name) != defaults[name]]  # fmt: skip
        if unused and not self.lora:
            raise ConfigError(
                f"{', '.join(unused)} set LoRA's adapters, which --lora_rank turns on: add --lora_rank (e.g. 16), or "
                "drop them (with --init_from alone every weight trains)."
            )
        if self.lora and self.init_from is None:
            raise ConfigError(
                "--lora_rank trains adapters on a frozen base model, which --init_from names: pass --init_from RUN "
                "(a run folder, a checkpoint.pt or a course-layout state dict)."
            )

    @property
    def lora(self) -> bool:
        return self.lora_rank is not None

    @property
    def scale(self) -> float:
        return (self.lora_alpha if self.lora_alpha is not None else self.lora_rank) / self.lora_rank


@dataclass(frozen=True)
class RunConfig:
    # A named model/batch shape (see PRESETS); "auto" picks by device. Explicit fields override it.
    preset: str = "auto"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    fp8: FP8Config = field(default_factory=FP8Config)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RunConfig:
        return _build(values)

    def replace(self, **sections: dict[str, Any]) -> RunConfig:
        """A copy with fields of the named sections changed, e.g. config.replace(train={"max_steps": 5})."""
        changed = {name: dataclasses.replace(getattr(self, name), **fields) for name, fields in sections.items()}
        return dataclasses.replace(self, **changed)

    def with_fp8(self, use_fp8: bool) -> RunConfig:
        """The same run with FP8 on or off: the twin a BF16-vs-FP8 comparison trains."""
        return self.replace(fp8={"use_fp8": use_fp8})


# Shapes we benchmark and recommend. "cpu-small" learns visibly in about two minutes on two cores.
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "cpu-small": {
        "model": dict(dim=128, n_layers=4, n_heads=4, intermediate_size=384, vocab_size=2048, context_length=128),
        "train": dict(batch_size=16, max_steps=400, log_every=20, eval_every=100, checkpoint_every=200),
        "optim": dict(lr=2e-3, min_lr=2e-4, warmup_steps=40),
    },
    "366m": {
        "model": dict(dim=896, n_layers=24, n_heads=14, intermediate_size=3584, vocab_size=32000, context_length=2048),
        "train": dict(batch_size=8),
    },
    "gpt2-small": {
        "model": dict(dim=768, n_layers=12, n_heads=12, intermediate_size=3072, vocab_size=50304, context_length=1024),
        "train": dict(batch_size=16),
    },
    "1.3b": {
        "model": dict(dim=2048, n_layers=22, n_heads=16, intermediate_size=5632, vocab_size=32000, context_length=2048),
        # Under DDP, 400 MB buckets measured fastest of 25, 100 and 400 on 2 GPUs:
        # INDEX.md: 2026-11-23-sweep-1.3b-x2-h200x2.
        "train": dict(batch_size=4, ddp_bucket_mb=400),
    },
}
SECTIONS = {
    "model": ModelConfig, "data": DataConfig, "optim": OptimConfig, "train": TrainConfig, "fp8": FP8Config,
    "finetune": FinetuneConfig,
}  # fmt: skip


_JSON_TYPES = {type(None): "null", bool: "true or false", int: "a number", float: "a number", str: "a string",
               list: "an array", dict: "an object"}  # fmt: skip


def _json_type(value: Any) -> str:
    return _JSON_TYPES.get(type(value), type(value).__name__)


def check_layer(values: Any, source: str = "the config", each_setting: bool = False) -> dict[str, Any]:
    """`values` if it is a layer of settings (a config file's, the command line's): an object of sections, each an
    object of settings (or absent), the preset a name; else a ConfigError naming the section and `source`. Checked
    before the layers merge, where a section that is not an object would stand in for the preset's whole section.
    `each_setting` (a file's layer): every setting checked on its own too, so that an error names the file."""
    if not isinstance(values, dict):
        raise ConfigError(f"{source} must hold a JSON object of sections, got {_json_type(values)}.")
    unknown = set(values) - set(SECTIONS) - {"preset"}
    if unknown:
        raise ConfigError(
            f"{source}: unknown config sections {sorted(unknown)}; expected preset, {', '.join(SECTIONS)}."
        )
    for name, value in values.items():
        kind = str if name == "preset" else dict
        if not isinstance(value, kind):
            what = "a preset name" if kind is str else "an object of settings (or absent)"
            raise ConfigError(f"{source}: section {name!r} must be {what}, got {_json_type(value)}.")
        if kind is dict and each_setting:
            _check_settings(name, value, source)
    return values


def check_known_settings(section: str, settings: dict[str, Any], where: str = "") -> None:
    known = sorted(f.name for f in dataclasses.fields(SECTIONS[section]))
    unknown = sorted(set(settings) - set(known))
    if unknown:
        raise ConfigError(f"{where}unknown {section} settings {unknown}; valid ones: {known}.")


def _check_settings(section: str, settings: dict[str, Any], source: str) -> None:
    """Each setting of one section of a layer, on its own: a known name, the field's type, choices and range; a
    ConfigError naming `source` and the setting. Checks that relate several settings run once the layers merge."""
    cls = SECTIONS[section]
    fields = {f.name: f for f in dataclasses.fields(cls)}
    check_known_settings(section, settings, f"{source}: ")
    hints = typing.get_type_hints(cls)
    for name, value in settings.items():
        try:
            value = _checked_value(name, value, hints[name])
        except ConfigError as exc:
            raise ConfigError(f"{source}: {section}.{exc}") from exc
        problem = field_problem(fields[name], value) if value is not None else None
        if problem:
            raise ConfigError(f"{source}: {section}.{name} {problem}; got {value!r}.")


def _build(values: dict[str, Any]) -> RunConfig:
    check_layer(values)
    sections = {}
    for name, cls in SECTIONS.items():
        given = values.get(name, {})
        check_known_settings(name, given)
        sections[name] = cls(**given)
    preset = values.get("preset", "auto")
    if preset != "auto" and preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}; choose one of auto, {', '.join(PRESETS)}.")
    return RunConfig(preset=preset, **sections)
