"""The main job, in the order of its operations: check the run folder and data paths (cheap, first) → under
torchrun, join the process group (a refusal of those checks, made by every rank or by some, stops every rank there) →
lock the folder (every rank must see rank 0's lock), read and check the checkpoint to resume → plan (resolve, probe
FP8, refuse what cannot run) → data → build the model and convert to FP8 (build.py) → summary → write the run's
config → Trainer (parallelizes, compiles) → train → results.

Nothing is written to the run folder before every check has passed, apart from its lock file, which a refused run
removes again (and the folder, if the run created it). Under torchrun every rank runs this; rank 0 alone holds the
folder's lock, prints and writes its files (the sharded checkpoint's shards excepted: every rank writes its own).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch

from cs336_basics.build import Built, build, plan
from cs336_basics.compiled import eager
from cs336_basics.config import RunConfig
from cs336_basics.data import BPETokenizer, check_data_sources, prepare_data, require_windows
from cs336_basics.errors import ConfigError, WorkFailed, alike_on_every_rank, writing
from cs336_basics.files.atomic import write_json_atomic
from cs336_basics.lora.base import base_tokenizer
from cs336_basics.measure.results import append_runs, format_or_na, result_record
from cs336_basics.optim import min_lr_from
from cs336_basics.parallel.world import main_first, process_group, refuse_together, torchrun_world
from cs336_basics.parallel.wrap import FSDP, ParallelPlan
from cs336_basics.precision.choice import AUTO_SETTINGS
from cs336_basics.training.run_folder import RunFolder
from cs336_basics.training.sampling import Sampling, sample_text
from cs336_basics.training.summary import RunFacts, format_summary
from cs336_basics.training.trainer import Trainer, TrainResult, global_batch_tokens, scheduled_lr, trained_ranks


def _resume_notes(checkpoint: dict[str, Any], config: RunConfig, parallel: ParallelPlan) -> list[str]:
    """What a resumed run (`config`, in `parallel`'s mode and world) does differently from the run its `checkpoint`
    continues, in words for the summary."""
    saved, step = RunConfig.from_dict(checkpoint["config"]), checkpoint["step"]
    extra = checkpoint.get("extra") or {}
    notes = []
    before, after = scheduled_lr(saved, step), scheduled_lr(config, step)
    if abs(after - before) > 1e-12 * max(abs(before), 1e-30):
        notes.append(
            f"the learning rate at step {step} changes from {before:.3g} to {after:.3g}: the schedule settings differ "
            "from the checkpoint's"
        )
    saved_data, data = _absolute_paths(saved).data, _absolute_paths(config).data  # the same file however it is named
    for name in ("dataset", "train_data", "val_data"):
        if getattr(data, name) != getattr(saved_data, name):
            notes.append(f"{name} {getattr(saved_data, name)} -> {getattr(data, name)}: it trains on other data")
    # The global batch is compared where the checkpoint records its ranks, the batch per rank where it does not.
    ranks = trained_ranks(checkpoint)
    if ranks is not None:
        before, after = global_batch_tokens(saved, ranks), global_batch_tokens(config, parallel.world.world_size)
        what = (
            f"tokens per step {before:,} -> {after:,}: the batch, micro-batches or ranks differ from the checkpoint's"
        )
    else:
        before, after = global_batch_tokens(saved, world_size=1), global_batch_tokens(config, world_size=1)
        what = (
            f"tokens per step and rank {before:,} -> {after:,}: --batch_size or --gradient_accumulation_steps "
            "differ from the checkpoint's"
        )
    if after != before:
        notes.append(what)
    if extra.get("parallel", parallel.mode) != parallel.mode:
        notes.append(f"parallel mode {extra['parallel']} -> {parallel.mode}")
    if (config.fp8.use_fp8, config.train.dtype) != (saved.fp8.use_fp8, saved.train.dtype):
        notes.append(
            f"precision {precision_name(saved)} -> {precision_name(config)}: the run goes on in another precision "
            "than its checkpoint's (asked for, or auto's choice on this machine)"
        )
    if config.train.max_steps != saved.train.max_steps:
        end = min_lr_from(config.optim.warmup_steps, config.optim.lr_decay_steps)
        notes.append(
            f"max_steps {saved.train.max_steps} -> {config.train.max_steps}; the learning rate reaches min_lr at step "
            f"{end}" + (" and stays there" if end < config.train.max_steps else "")
        )
    return notes


def precision_name(config: RunConfig) -> str:
    return f"FP8 ({config.train.dtype} weights)" if config.fp8.use_fp8 else config.train.dtype


# The settings that name files a run reads: the run holds them absolute (so its config.json and checkpoint do), so
# that a resume, a merge or a sample started from another folder finds them.
_INPUT_PATHS = {"data": ("train_data", "val_data", "tokenizer", "cache_dir"), "finetune": ("init_from",)}


def _absolute_paths(config: RunConfig) -> RunConfig:
    return config.replace(
        **{
            section: {name: str(Path(value).expanduser().absolute()) for name in names
                      if (value := getattr(getattr(config, section), name)) is not None}
            for section, names in _INPUT_PATHS.items()
        }
    )  # fmt: skip


def _check_tokenizer(folder: RunFolder, tokenizer: BPETokenizer | None) -> None:
    saved = folder.tokenizer_path
    if tokenizer is None or not (saved / "tokenizer.json").is_file():
        return
    if BPETokenizer.load(saved) != tokenizer:
        raise ConfigError(
            f"--resume: the data's tokenizer differs from the one this run trained with ({saved}); resume with the "
            "run's own --train_data and --vocab_size."
        )


def _check_base_tokenizer(config: RunConfig, tokenizer: BPETokenizer | None) -> None:
    """A fine-tune's data tokenised as its base's was: the same ids for the same text (a built-in corpus, or another
    --tokenizer, would bring a BPE of its own)."""
    if config.finetune.init_from is None or tokenizer is None:
        return
    base = base_tokenizer(config.finetune.init_from)
    if base is not None and BPETokenizer.load(base) != tokenizer:
        raise ConfigError(
            f"the data's tokenizer differs from the one the base was trained with ({base}), so its ids would mean "
            "other tokens than the base learned; train on .txt data (it is tokenised with the base's tokenizer), or "
            f"pass --tokenizer {base}."
        )


def run_training(config: RunConfig, results_json: str | Path | None = None, log=print) -> TrainResult | None:
    """Train `config` in its run folder. Returns the result, or None when a resumed run had nothing left to do."""
    config = _absolute_paths(config)
    t = config.train
    folder = RunFolder(t.out_dir)
    refusal = None
    try:
        with alike_on_every_rank():  # the ranks share the flags and (on one node, or a shared filesystem) the files
            folder.check_usable(t.resume, t.overwrite)
            # Before any heavy work: a wrong path fails in a second.
            check_data_sources(config.data, config.model.vocab_size)
    except ConfigError as exc:
        if torchrun_world() is None:
            raise
        refusal = exc  # told to the other ranks once the group exists, so that none waits there for this one
    with process_group(t.device, t.dist_timeout_s) as world:
        refuse_together(
            refusal,
            world,
            "another rank refused to start (its message says why): the nodes of a run must see the same files "
            "(--out_dir on a filesystem they share, the data at the same path).",
        )
        if not world.is_main:
            log = _silent
        with folder.locked() if world.is_main else contextlib.nullcontext():
            folder.check_shared(world)
            return _run_locked(config, folder, world, results_json, log)


def _silent(*args: Any, **kwargs: Any) -> None:
    """The log of every rank but 0."""


def _run_locked(config: RunConfig, folder: RunFolder, world, results_json, log) -> TrainResult | None:
    t = config.train
    requested_fp8 = config.fp8
    # Every rank reads the checkpoint: mapped, so that a machine's ranks share one copy of a whole checkpoint.
    with alike_on_every_rank():
        resume_state = folder.read_resume_state(config, mmap=world.launched) if t.resume else None
    notes: list[str] = []
    if resume_state is not None:
        step = resume_state["step"]
        if step >= t.max_steps:
            log(
                f"nothing to do: {folder.checkpoint_path} is at step {step} and max_steps is {t.max_steps}; "
                "pass a larger --max_steps to train further. The run folder was left as it was."
            )
            return None
    with alike_on_every_rank():  # process_group refused a GPU this rank cannot use already: plan's checks are alike
        p = plan(config)
    if resume_state is not None:
        notes = _resume_notes(resume_state, p.config, p.parallel)
    with main_first(world):  # rank 0 tokenizes and caches; the others read its cache
        data = prepare_data(p.config.data, p.config.model.vocab_size)
    _check_base_tokenizer(p.config, data.tokenizer)
    require_windows(len(data.train), p.config.model.context_length, "the training data")
    if t.eval_every > 0:  # nothing reads the validation data of a run that never evaluates
        more = "more validation data (--val_data), or --eval_every 0"
        require_windows(len(data.val), p.config.model.context_length, "the validation data", more)
    built = build(p)
    config = built.config
    if resume_state is not None:
        _check_tokenizer(folder, data.tokenizer)
    elif world.is_main:
        folder.start_fresh(t.overwrite)

    if built.device.type == "cuda" or config.fp8.use_fp8:
        log(built.plan.fp8_support.format())
    log(format_summary(config, _facts(built, data.description, notes)))
    # The run's settings, as a later --resume reads them: how this invocation started is not one of them, and the
    # settings left automatic stay automatic: FP8 on or off and its settings, the weights' dtype, compiling, the
    # compile mode and the wrapper. A resume chooses again, as for --parallel auto (on another world size the choice
    # may differ), and the file used as another run's --config on another machine gives that machine's choices, not
    # this one's (a CPU run's would otherwise turn a GPU run's FP8, BF16 and compile off).
    saved = config.replace(
        train={
            "resume": False,
            "overwrite": False,
            "dtype": t.dtype,
            "compile_model": t.compile_model,
            "compile_mode": t.compile_mode,
            "compile_wrapper": t.compile_wrapper,
        },
        fp8={"use_fp8": requested_fp8.use_fp8, **{name: getattr(requested_fp8, name) for name in AUTO_SETTINGS}},
    )
    before = "Nothing was trained." + (f" {folder.checkpoint_path} is intact." if resume_state is not None else "")
    trainer = None
    try:
        trainer = Trainer(
            built.model, config, data.train, data.val, built.device, log=log, resume_state=resume_state,
            parallel=built.parallel, converter=built.converter,
        )  # fmt: skip
        # Written once the Trainer holds the checkpoint's state: a resume its checkpoint does not fit (other adapters,
        # say) leaves the run's config.json as it was, so that a plain --resume still continues it.
        if world.is_main:
            with writing(folder.config_path, before):
                write_json_atomic(folder.config_path, saved.to_dict())
            if data.tokenizer is not None and resume_state is None:
                with writing(folder.tokenizer_path, before):
                    data.tokenizer.save(folder.tokenizer_path)
        result = trainer.train()
    except (RuntimeError, MemoryError) as exc:
        if not _out_of_memory(exc):
            raise
        where = f"at step {trainer.step + 1}" if trainer is not None else "before the first step"
        raise _memory_advice(config, built.device, where, trainer.kept() if trainer is not None else before) from exc
    if world.is_main:
        _report(result, built, folder, data, results_json, log)
    return result


def _out_of_memory(exc: BaseException) -> bool:
    """An allocation that failed: the CUDA allocator's, the CPU allocator's (a plain RuntimeError) or Python's."""
    return isinstance(exc, torch.OutOfMemoryError | MemoryError) or "DefaultCPUAllocator: can't allocate" in str(exc)


def _memory_advice(config: RunConfig, device: torch.device, where: str, intact: str) -> WorkFailed:
    t, m = config.train, config.model
    recompute = (
        "; --gradient_checkpointing is on already"
        if m.gradient_checkpointing
        else ", or pass --gradient_checkpointing (backward recomputes the activations instead of keeping them)"
    )
    return WorkFailed(
        f"out of memory on {device} {where}: a micro-batch of {t.batch_size} x {m.context_length} tokens "
        f"(--batch_size x --context_length) through the {m.n_layers}-layer, dim {m.dim} model does not fit. Lower "
        f"--batch_size and raise --gradient_accumulation_steps (now {t.gradient_accumulation_steps}) to keep the "
        f"global batch{recompute}. {intact}"
    )


def _report(result: TrainResult, built: Built, folder: RunFolder, data, results_json, log) -> None:
    """Rank 0, after training: the result, the run's record (result.json, and --results_json), and a sample."""
    config, world = built.config, built.plan.world
    log(format_result(result))
    parallel = {"world_size": world.world_size, "parallel": built.parallel.mode,
                "fsdp_reshard_after_forward": built.parallel.reshard_after_forward}  # fmt: skip
    if world.world_size > 1:  # what the measurements mean on several GPUs, kept with them
        parallel["parallel_note"] = (
            f"tokens_per_sec: all {world.world_size} ranks together (global batch / median step time); mfu: against "
            f"{world.world_size} x the peak; peak_mem_gib: per GPU, the largest over the ranks"
        )
    record = result_record(config, result, **_parameter_counts(built), **parallel)
    kept = result.checkpoint_path or "none: --checkpoint_every 0"
    finished = f"The training finished; its checkpoint ({kept}) and metrics ({result.metrics_path}) are intact."
    with writing(folder.result_path, finished):
        write_json_atomic(folder.result_path, record)
    if results_json is not None:
        with writing(results_json, f"{finished} So is {folder.result_path}."):
            append_runs(results_json, [record])
    log(format_outputs(folder, result))
    if data.tokenizer is not None and built.parallel.mode != FSDP:
        with eager():  # each new length would compile (and under CUDA graphs record) the model's regions again
            sample = sample_text(built.model, data.tokenizer, Sampling(prompt="def ", max_new_tokens=48))
        log(f"sample: {sample!r}")
    elif data.tokenizer is not None:  # every rank would have to run the sharded model's forward passes in step
        if result.checkpoint_path is None:
            log("sample: none (FSDP2 shards the model over the ranks, and this run kept no checkpoint to sample from)")
        else:
            generate = f"python -m cs336_basics.programs.generate --out_dir {config.train.out_dir}"
            log(f"sample: run {generate} (reads the sharded checkpoint)")


def _parameter_counts(built: Built) -> dict[str, Any]:
    return {
        "total_params": built.model.num_parameters(),
        "non_embedding_params": built.model.num_parameters(exclude_embeddings=True),
    }


def _facts(built: Built, data_description: str, notes: list[str]) -> RunFacts:
    counts = _parameter_counts(built)
    return RunFacts(
        device=built.device,
        total_params=counts["total_params"],
        non_embedding_params=counts["non_embedding_params"],
        attention_kernel=built.plan.attention_kernel,
        data_description=data_description,
        auto_choices=list(built.auto_choices),
        fp8_line=built.fp8_line,
        fp8_capable=built.plan.fp8_support.ok,
        resume_notes=notes,
        parallel=built.parallel,
        finetune_rows=built.finetune_rows,
    )


def format_result(result: TrainResult) -> str:
    num = format_or_na
    return (
        f"done: {result.steps} steps, {result.tokens:,} tokens, loss {num(result.loss, '.4f')}, "
        f"val loss {num(result.val_loss, '.4f')}, {num(result.tokens_per_sec, ',.0f')} tokens/s, "
        f"MFU {num(None if result.mfu is None else 100 * result.mfu, '.1f', '%')}, "
        f"peak memory {num(result.peak_mem_gib, '.2f', ' GiB')}, compile {num(result.compile_s, '.1f', ' s')}"
    )


def format_outputs(folder: RunFolder, result: TrainResult) -> str:
    lines = [
        f"  metrics:    {result.metrics_path}",
        f"  loss curve: {result.plot_path}",
        f"  checkpoint: {result.checkpoint_path or 'none (--checkpoint_every 0)'}",
        f"  result:     {folder.result_path}",
        f"  config:     {folder.config_path}",
    ]
    return "wrote:\n" + "\n".join(lines)
