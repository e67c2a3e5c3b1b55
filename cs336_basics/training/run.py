"""The main job, in the order of its operations: resolve config → data → build model → move to device and
dtype → FP8 conversion → count Float8 modules → summary → Trainer (compiles) → train → results and a sample."""

from __future__ import annotations

import dataclasses
import gc
import json
import tempfile
from pathlib import Path

import torch

from cs336_basics.config import RunConfig
from cs336_basics.data import prepare_data
from cs336_basics.errors import ConfigError
from cs336_basics.generate import sample_text
from cs336_basics.model import TransformerLM, check_attention_backend
from cs336_basics.precision import (
    check_fp8_support,
    check_fp8_tokens,
    convert_model_to_fp8,
    count_float8_linears,
    require_fp8,
    skip_reason,
)
from cs336_basics.results import append_runs, format_or_na, result_record
from cs336_basics.runtime import resolve, torch_dtype
from cs336_basics.training.summary import RunFacts, format_summary
from cs336_basics.training.trainer import Trainer, TrainResult


def preflight(config: RunConfig) -> tuple[RunConfig, torch.device, list[str], str]:
    """Can this machine run `config`? Resolves the "auto" settings and makes every machine check before any
    work (device present, FP8 support and batch shape, attention kernel); a ConfigError says why not.
    Returns the resolved config, the device, the automatic choices and the attention kernel's description."""
    config, device, auto = resolve(config)
    t, m, fp8 = config.train, config.model, config.fp8
    if fp8.use_fp8:
        require_fp8(fp8, device)
        check_fp8_tokens(t.batch_size, m.context_length, fp8)
    kernel = check_attention_backend(m.attention, device, torch_dtype(t.dtype), head_dim=m.head_dim)
    return config, device, auto, kernel


def seeded_model(config: RunConfig, device: torch.device) -> TransformerLM:
    """config's model on `device` in its training dtype. Seeded, so two builds (a BF16 and an FP8 run of one
    comparison) start from the same weights."""
    torch.manual_seed(config.train.seed)
    return TransformerLM(config.model).to(device=device, dtype=torch_dtype(config.train.dtype))


def train_for_measurement(
    model: torch.nn.Module, config: RunConfig, train_tokens, val_tokens, device: torch.device, log=print
) -> tuple[Trainer, TrainResult]:
    """Train `model` for config.train.max_steps as a measurement rather than a run to keep: no evaluation, no
    checkpoints, no resume, in a folder deleted afterwards. The returned Trainer can still take (profiled) steps."""
    with tempfile.TemporaryDirectory() as out_dir:
        train = dataclasses.replace(config.train, out_dir=out_dir, eval_every=0, checkpoint_every=0, resume=False)
        trainer = Trainer(model, dataclasses.replace(config, train=train), train_tokens, val_tokens, device, log=log)
        return trainer, trainer.train()


def release_memory() -> None:
    """Between two measured runs in one process: drop compiled graphs and cached GPU memory, so the next run
    compiles afresh and its peak memory is its own."""
    gc.collect()
    torch._dynamo.reset()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_training(config: RunConfig, results_json: str | Path | None = None, log=print) -> TrainResult:
    fp8_auto = config.fp8.use_fp8 is None
    config, device, auto, attention_kernel = preflight(config)
    t, m, fp8 = config.train, config.model, config.fp8
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # only float32 matmuls are affected; BF16 ones are not
        torch.backends.cudnn.allow_tf32 = True

    data = prepare_data(config.data, m.vocab_size)
    for name, tokens in (("training", data.train), ("validation", data.val)):
        if len(tokens) <= m.context_length:
            raise ConfigError(
                f"context_length {m.context_length} is longer than the {name} data ({len(tokens)} tokens); "
                "use a smaller --context_length or more data."
            )

    model = seeded_model(config, device)
    fp8_line = "off"
    if fp8.use_fp8 and fp8_auto and not any(skip_reason(mod, fqn, fp8) is None for fqn, mod in model.named_modules()):
        # FP8 was our choice, not the user's: with no layer worth converting, say so and stay in BF16.
        config = dataclasses.replace(config, fp8=dataclasses.replace(fp8, use_fp8=False))
        fp8 = config.fp8
        auto = [a for a in auto if not a.startswith("use_fp8")] + ["use_fp8=False (no layer passes the FP8 filter)"]
    if fp8.use_fp8:
        report = convert_model_to_fp8(model, fp8)
        counted = count_float8_linears(model)
        if counted == 0:  # convert_model_to_fp8 already refuses this; the count is the independent check
            raise ConfigError("FP8 was requested but no Float8Linear modules are in the model after conversion.")
        fp8_line = f"{report.summary_line()}; {counted} Float8Linear modules counted"
    fp8_support = check_fp8_support(device)
    facts = RunFacts(
        device=device,
        total_params=model.num_parameters(),
        non_embedding_params=model.num_parameters(exclude_embeddings=True),
        attention_kernel=attention_kernel,
        data_description=data.description,
        auto_choices=auto,
        fp8_line=fp8_line,
        fp8_capable=fp8_support.ok,
    )
    if device.type == "cuda" or fp8.use_fp8:
        log(fp8_support.format())
    log(format_summary(config, facts))

    out_dir = Path(t.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config.to_dict(), indent=2) + "\n")
    if data.tokenizer is not None:
        data.tokenizer.save(out_dir / "tokenizer")

    result = Trainer(model, config, data.train, data.val, device, log=log).train()
    log(format_result(result))
    record = result_record(
        config, result, total_params=facts.total_params, non_embedding_params=facts.non_embedding_params
    )
    (out_dir / "result.json").write_text(json.dumps(record, indent=2) + "\n")
    if results_json is not None:
        append_runs(results_json, [record])
    if data.tokenizer is not None:
        log("sample: " + repr(sample_text(model, data.tokenizer, prompt="def ", max_new_tokens=48)))
    return result


def format_result(result: TrainResult) -> str:
    num = format_or_na
    return (
        f"done: {result.steps} steps, {result.tokens:,} tokens, loss {num(result.loss, '.4f')}, "
        f"val loss {num(result.val_loss, '.4f')}, {num(result.tokens_per_sec, ',.0f')} tokens/s, "
        f"MFU {num(None if result.mfu is None else 100 * result.mfu, '.1f', '%')}, "
        f"peak memory {num(result.peak_mem_gib, '.2f')} GiB, compile {num(result.compile_s, '.1f')} s"
    )
