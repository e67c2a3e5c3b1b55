"""The tiny model the CPU tests train, defined once: 2 blocks (15 linear layers with the lm_head), every linear
dimension a multiple of 16 so that (emulated) FP8 can convert it, and a vocabulary of 64 (the ids of the
`token_files` fixture). Tests that need another shape say so as overrides of this one."""

from __future__ import annotations

from cs336_basics.config import ModelConfig

TINY_MODEL = dict(vocab_size=64, context_length=16, dim=32, n_layers=2, n_heads=2, intermediate_size=64)


def tiny_model(**overrides) -> ModelConfig:
    return ModelConfig(**{**TINY_MODEL, **overrides})


def tiny_flags(device: str = "cpu", **overrides) -> list[str]:
    """The tiny model as train_h100.py flags, with a batch of 4 and a short warm-up."""
    values = {**TINY_MODEL, **overrides}
    flags = [f"--{name}={value}" for name, value in values.items()]
    return [*flags, f"--device={device}", "--batch_size=4", "--warmup_steps=2"]


TINY_FLAGS = tiny_flags()
