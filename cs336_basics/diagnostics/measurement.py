"""Training as a measurement (the FP8 verification and the Amdahl analysis): a few steps in a throwaway folder,
then the memory handed back so the next measurement in the same process starts clean."""

from __future__ import annotations

import gc
import tempfile

import torch

from cs336_basics.build import Built
from cs336_basics.parallel.world import barrier, broadcast_text
from cs336_basics.training.trainer import Trainer, TrainResult


def train_for_measurement(built: Built, train_tokens, val_tokens, log=print) -> tuple[Trainer, TrainResult]:
    """Train a built model for its config's max_steps as a measurement rather than a run to keep: no evaluation, no
    checkpoints, no resume, in a folder deleted afterwards. The returned Trainer can still take (profiled) steps.
    Under torchrun every rank trains in rank 0's folder: a run folder is one for all ranks (each checks that it sees
    rank 0's lock there)."""
    with tempfile.TemporaryDirectory() as own_dir:
        changes = {"out_dir": broadcast_text(own_dir), "eval_every": 0, "checkpoint_every": 0, "resume": False}
        config = built.config.replace(train=changes)
        trainer = Trainer(
            built.model, config, train_tokens, val_tokens, built.device, log=log, parallel=built.parallel,
            converter=built.converter,
        )  # fmt: skip
        result = trainer.train()
        barrier()  # every rank done with the folder before rank 0 removes it
        return trainer, result


def release_memory() -> None:
    """Between two measured runs in one process: drop compiled graphs and cached GPU memory, so the next run
    compiles afresh and its peak memory is its own."""
    gc.collect()
    torch._dynamo.reset()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
