"""The one results-file schema shared by every script and benchmark (see README, "Performance"):
{"gpu", "torch", "torchao", "command", "runs": [flat records]}."""

from __future__ import annotations

import json
import math
import shlex
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from cs336_basics.config import LORA_FP8_PATH, RunConfig
from cs336_basics.errors import ConfigError, WorkFailed, os_reason
from cs336_basics.files.atomic import write_json_atomic
from cs336_basics.files.output_paths import check_output_path


def _command_line() -> str:
    """How this process was started, as a user would retype it: `python -m pkg.mod ...` for a module of a package
    run with -m (argv[0] is then the module's file path: this package's modules, the lab's tools), else the script's
    name and its arguments."""
    script = Path(sys.argv[0]).resolve()
    outside = script.parent  # the folder that holds the module's top-level package
    while (outside / "__init__.py").is_file():
        outside = outside.parent
    if script.suffix == ".py" and outside != script.parent:
        module = ".".join(script.relative_to(outside).with_suffix("").parts).removesuffix(".__main__")
        head = ["python", "-m", module]
    else:
        head = [Path(sys.argv[0]).name]
    return " ".join(shlex.quote(a) for a in [*head, *sys.argv[1:]])


def environment() -> dict[str, Any]:
    try:
        torchao_version = metadata.version("torchao")
    except metadata.PackageNotFoundError:
        torchao_version = None
    return {
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "torchao": torchao_version,
        "command": _command_line(),
    }


# The fields every record of a results file names (GUIDE: one schema for every results file). A record of a
# measurement that is not a training run (a tokenizer timing, say) gives None where a field does not apply.
REQUIRED_FIELDS = (
    "preset", "dim", "n_layers", "n_heads", "d_ff", "vocab_size", "batch_size", "seq_len", "precision", "compile",
    "attention", "tokens_per_sec", "mfu", "peak_mem_gib", "compile_s", "loss", "status", "world_size", "parallel",
    "gradient_checkpointing", "fp8_shape_filter", "fp8_lm_head", "fp8_path", "fp8_scaling",
)  # fmt: skip


def schema_record(**fields: Any) -> dict[str, Any]:
    """A record with every required field (None where it does not apply) and the given ones."""
    return {**dict.fromkeys(REQUIRED_FIELDS), **fields}


def precision_label(config: RunConfig) -> str:
    """ "bf16", "fp32", "fp8-<recipe>" (TorchAO's path), "fp8-fused-<scaling>" (this package's) or "fp8-accelerate"
    (Accelerate's), with "-emulated" for a run on CPU."""
    fp8 = config.fp8
    if fp8.use_fp8:
        if config.finetune.lora:  # a LoRA base runs its own tensorwise linears (lora/layers.py), either path
            name = "fp8-tensorwise" + ("-delayed" if fp8.fp8_scaling == "delayed" else "")
        elif fp8.fp8_path == "torchao":
            name = f"fp8-{fp8.fp8_recipe}"
        elif fp8.fp8_path == "accelerate":
            name = "fp8-accelerate" + ("" if fp8.fp8_recipe == "tensorwise" else f"-{fp8.fp8_recipe}")
        else:
            name = f"fp8-fused-{fp8.fp8_scaling}"
        return name + ("-emulated" if fp8.fp8_emulate else "")
    return {"bfloat16": "bf16", "float32": "fp32"}.get(config.train.dtype, config.train.dtype)


def run_record(config: RunConfig, status: str = "ok", **measured: Any) -> dict[str, Any]:
    """A flat record: the shape and settings of the run plus whatever was measured."""
    m, t, fp8 = config.model, config.train, config.fp8
    own_linears = fp8.fp8_path == "fused" or config.finetune.lora  # this package's FP8 linears, not TorchAO's
    record = {
        "preset": config.preset,
        "hf_model": m.hf_model,  # a Hugging Face model: its config gave the shape below, not the preset
        "dim": m.dim,
        "n_layers": m.n_layers,
        "n_heads": m.n_heads,
        "n_kv_heads": m.kv_heads,
        "d_ff": m.intermediate_size,
        "vocab_size": m.vocab_size,
        "batch_size": t.batch_size,
        "gradient_accumulation_steps": t.gradient_accumulation_steps,
        "seq_len": m.context_length,
        "precision": precision_label(config),
        "compile": t.compile_mode if t.compile_model else False,
        "compile_scope": t.compile_scope if t.compile_model else None,
        "compile_wrapper": t.compile_wrapper if t.compile_model else None,
        "attention": m.attention,
        "gradient_checkpointing": m.gradient_checkpointing,
        "world_size": 1,
        "parallel": "none",
        "ddp_bucket_mb": t.ddp_bucket_mb,  # used by --parallel ddp only
        # Used by --parallel fsdp only; None (auto) until a run resolves it: a finished run records the plan's.
        "fsdp_reshard_after_forward": t.fsdp_reshard_after_forward,
        "fsdp_blocks_per_unit": t.fsdp_blocks_per_unit,  # used by --parallel fsdp only
        "fp8_all_gather": bool(fp8.use_fp8 and fp8.fp8_all_gather),  # used by --parallel fsdp only
        "fp8_lm_head": bool(fp8.use_fp8 and fp8.fp8_lm_head),
        # None without FP8: the FP8 settings resolved for a BF16 run depend on where it runs (TorchAO's path under
        # DDP), which would set two BF16 rows of one configuration apart.
        "fp8_shape_filter": fp8.fp8_shape_filter if fp8.use_fp8 else None,
        # A LoRA run's frozen base runs its own FP8 linears (lora/layers.py), whichever path was named.
        "fp8_path": (LORA_FP8_PATH if config.finetune.lora else fp8.fp8_path) if fp8.use_fp8 else None,
        "fp8_scaling": fp8.fp8_scaling if fp8.use_fp8 else None,
        "fp8_fast_accum_backward": bool(fp8.use_fp8 and fp8.fp8_fast_accum_backward),
        # The fused path's cast savings; a LoRA base has them on either path.
        "fp8_share_input_casts": bool(fp8.use_fp8 and own_linears and fp8.fp8_share_input_casts),
        "fp8_fused_swiglu": bool(fp8.use_fp8 and own_linears and fp8.fp8_fused_swiglu),
        "fp8_fused_rope": bool(fp8.use_fp8 and own_linears and fp8.fp8_share_input_casts and fp8.fp8_fused_rope),
        "lora_rank": config.finetune.lora_rank,
        "lora_targets": config.finetune.lora_targets if config.finetune.lora else None,
        "tokens_per_sec": None,
        "mfu": None,
        "peak_mem_gib": None,
        "compile_s": None,
        "loss": None,
        "status": status,
    }
    record.update(measured)
    return schema_record(**record)  # every required field named, whatever the caller measured


# A run's per-step series (trainer.TrainResult), in its timed steps' order: step_ms, each step's time on the GPU, then,
# one list per rank, what its host saw of the same steps.
HOST_SERIES = ("host_ms", "host_cpu_ms", "gc_ms")
STEP_SERIES = ("step_ms", *HOST_SERIES)


def result_record(config: RunConfig, result: Any, **extra: Any) -> dict[str, Any]:
    """The record of a finished training run (a trainer.TrainResult)."""
    measured = ("tokens_per_sec", "mfu", "peak_mem_gib", "compile_s", "loss", "val_loss", "steps", "tokens",
                "step_ms_p10", "step_ms_p90", *STEP_SERIES)  # fmt: skip
    return run_record(config, **{name: getattr(result, name) for name in measured}, **extra)


def write_results(path: str | Path, runs: list[dict[str, Any]], **fields: Any) -> Path:
    """A new results file: this machine's header, any extra top-level `fields`, and the runs."""
    return write_json_atomic(path, {**environment(), **fields, "runs": runs})


def _read_results(path: Path) -> dict[str, Any]:
    """The results file at `path`; a ValueError saying why it is not one."""
    try:
        data = json.loads(path.read_bytes())
    except RecursionError as exc:  # json's parser recurses once per level
        raise ValueError("it is not JSON (nested too deeply to read)") from exc
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"it is not JSON ({exc})") from exc
    if not isinstance(data, dict) or "runs" not in data:
        raise ValueError('it has no "runs" list (a results file is a JSON object with one)')
    if not isinstance(data["runs"], list):
        raise ValueError('its "runs" is not a list')
    return data


def check_results_file(path: str | Path, flag: str, fix: str = "Name a new file or a results file.") -> Path:
    """`path` as a results file to add records to (append_runs), checked before the work: a file this program can
    write, and where it exists already, a results file; else a ConfigError naming `flag` and saying `fix`."""
    path = check_output_path(path, flag, folder=False)
    if path.exists():
        try:
            _read_results(path)
        except ValueError as exc:
            raise ConfigError(f"{flag} {path} cannot be used: {exc}. {fix}") from exc
        except OSError as exc:
            raise ConfigError(f"{flag} {path} cannot be read: {os_reason(exc)}. Choose another {flag}.") from exc
    return path


def append_runs(path: str | Path, records: list[dict[str, Any]]) -> Path:
    """Add records to a results file (created with this machine's header if new); written atomically."""
    path = Path(path)
    env = environment()
    try:
        data = _read_results(path) if path.exists() else {**env, "runs": []}
    except ValueError as exc:  # the file was checked before the work (check_results_file): it changed since
        raise WorkFailed(f"could not add to {path}: {exc}.") from exc
    # Several commands may add to one file: each record keeps the command that produced it.
    data["runs"].extend({**record, "command": record.get("command", env["command"])} for record in records)
    return write_json_atomic(path, data)


def format_or_na(value: float | None, spec: str, suffix: str = "") -> str:
    """A number for a table or log line; "n/a" for a value that was not measured (None or NaN)."""
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{value:{spec}}{suffix}"
