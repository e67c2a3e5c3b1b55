"""Sample text from a trained run:

    uv run python -m cs336_basics.programs.generate --out_dir runs/default --prompt "def "

Every sampling setting is checked like train_h100.py's (declared once, with its range): an empty prompt, a NaN or
negative temperature, top_p outside (0, 1] or max_new_tokens below 1 is one line and exit code 2."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

from cs336_basics.build import new_model
from cs336_basics.cli import add_field_arguments
from cs336_basics.config import RunConfig
from cs336_basics.data import BPETokenizer
from cs336_basics.devices import resolve_device
from cs336_basics.errors import ConfigError, run_program
from cs336_basics.training.checkpoint import CHECKPOINT_NAME
from cs336_basics.training.restore import restore_checkpoint
from cs336_basics.training.sampling import Sampling, sample_text
from cs336_basics.training.sharded_checkpoint import read_whole_checkpoint
from cs336_basics.training.signals import terminate_raises


def load_trained(out_dir: Path, device: torch.device, base: str | None = None) -> tuple[torch.nn.Module, BPETokenizer]:
    """Rebuild the model from a run folder's checkpoint (its saved config gives the shape) and tokenizer. `base`: a
    LoRA run's base where it is now, if it moved."""
    checkpoint = out_dir / CHECKPOINT_NAME
    state = read_whole_checkpoint(checkpoint)  # once: a run still training may replace its checkpoint meanwhile
    config = RunConfig.from_dict(state["config"])
    if config.finetune.lora:  # adapters alone: the base they fine-tune, with them folded in
        from cs336_basics.lora.merge import lora_model, merge_adapters

        model = merge_adapters(lora_model(checkpoint, base)[0])
    elif base is not None:
        raise ConfigError(f"--base names a LoRA run's base, and {out_dir} is not a LoRA run: it holds its whole model.")
    else:
        model = new_model(config.model)  # this package's model, or a Hugging Face one (--hf_model)
        restore_checkpoint(state, model=model, restore_rng=False)
    if not (out_dir / "tokenizer").is_dir():
        raise ConfigError(f"{out_dir} has no tokenizer/ folder (the run trained on pre-tokenised arrays).")
    return model.to(device).eval(), BPETokenizer.load(out_dir / "tokenizer")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, allow_abbrev=False)
    parser.add_argument("--out_dir", default="runs/default", help="the run folder written by train_h100.py")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--base", help="a LoRA run's base where it is now, if it moved since the run started")
    add_field_arguments(parser.add_argument_group("sampling settings"), Sampling)
    args = parser.parse_args(argv)

    def generate() -> int:
        names = {f.name for f in dataclasses.fields(Sampling)}
        sampling = Sampling(**{k: v for k, v in vars(args).items() if k in names and v is not None})
        device = resolve_device(args.device)
        model, tokenizer = load_trained(Path(args.out_dir), device, args.base)
        with terminate_raises():
            print(sample_text(model, tokenizer, sampling))
        return 0

    return run_program(generate, after_interrupt=lambda: "No sample was printed.")


if __name__ == "__main__":
    sys.exit(main())
