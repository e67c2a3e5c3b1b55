"""Training as a measurement (the FP8 verification and the Amdahl analysis): a few steps in a throwaway folder,
then the memory handed back so the next measurement in the same process starts clean."""

from __future__ import annotations

import gc
import tempfile

import numpy as np
import torch

from cs336_basics.build import Built, build
from cs336_basics.config_layers import build_config
from cs336_basics.training.trainer import Trainer, TrainResult


def train_for_measurement(built: Built, train_tokens, val_tokens, log=print) -> tuple[Trainer, TrainResult]:
    """Train a built model for its config's max_steps as a measurement rather than a run to keep: no evaluation, no
    checkpoints, no resume, in a folder deleted afterwards. The returned Trainer can still take (profiled) steps."""
    with tempfile.TemporaryDirectory() as out_dir:
        changes = {"out_dir": out_dir, "eval_every": 0, "checkpoint_every": 0, "resume": False}
        config = built.config.replace(train=changes)
        trainer = Trainer(
            built.model, config, train_tokens, val_tokens, built.device, log=log, converter=built.converter
        )
        return trainer, trainer.train()


PROBE_PRECISIONS = ("bf16", "fp8")  # what warmed_up_preset builds: BF16, or the default FP8 path


def warmed_up_preset(preset: str, fp8: bool, compile_mode: str, warmup: int) -> tuple[Built, Trainer]:
    """A preset built for CUDA (FP8 by the default path, or BF16) and trained `warmup` steps on random tokens
    (compile included), its Trainer ready for measured steps. For probes of the step itself (host time, memory),
    which do not depend on the text."""
    config = build_config(
        {"preset": preset, "fp8": {"use_fp8": fp8}, "train": {"max_steps": warmup, "log_every": warmup,
                                                               "compile_mode": compile_mode}},
        device_type="cuda",
    )  # fmt: skip
    built = build(config)
    tokens = np.random.default_rng(0).integers(0, config.model.vocab_size, 4_000_000, dtype=np.int64)
    trainer, _ = train_for_measurement(built, tokens, tokens, log=lambda message: None)
    return built, trainer


def release_memory() -> None:
    """Between two measured runs in one process: drop compiled graphs and cached GPU memory, so the next run
    compiles afresh and its peak memory is its own."""
    gc.collect()
    torch._dynamo.reset()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
