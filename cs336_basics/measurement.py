"""Training as a measurement (the FP8 verification and the Amdahl analysis): a few steps in a throwaway folder,
then the memory handed back so the next measurement in the same process starts clean."""

from __future__ import annotations

import gc
import tempfile

import torch

from cs336_basics.config import RunConfig
from cs336_basics.training.trainer import Trainer, TrainResult


def train_for_measurement(
    model: torch.nn.Module, config: RunConfig, train_tokens, val_tokens, device: torch.device, log=print
) -> tuple[Trainer, TrainResult]:
    """Train `model` for config.train.max_steps as a measurement rather than a run to keep: no evaluation, no
    checkpoints, no resume, in a folder deleted afterwards. The returned Trainer can still take (profiled) steps."""
    with tempfile.TemporaryDirectory() as out_dir:
        config = config.replace(train={"out_dir": out_dir, "eval_every": 0, "checkpoint_every": 0, "resume": False})
        trainer = Trainer(model, config, train_tokens, val_tokens, device, log=log)
        return trainer, trainer.train()


def release_memory() -> None:
    """Between two measured runs in one process: drop compiled graphs and cached GPU memory, so the next run
    compiles afresh and its peak memory is its own."""
    gc.collect()
    torch._dynamo.reset()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
