"""Sample text from a trained run:  uv run python -m cs336_basics.generate --out_dir runs/default --prompt "def " """

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from cs336_basics.build import resolve_device
from cs336_basics.config import RunConfig
from cs336_basics.data import BPETokenizer
from cs336_basics.errors import ConfigError, report_error
from cs336_basics.model import TransformerLM
from cs336_basics.training.checkpoint import CHECKPOINT_NAME, load_checkpoint


def load_trained(out_dir: Path, device: torch.device) -> tuple[TransformerLM, BPETokenizer]:
    """Rebuild the model from a run folder's checkpoint (its saved config gives the shape) and tokenizer."""
    checkpoint = out_dir / CHECKPOINT_NAME
    state = load_checkpoint(checkpoint, restore_rng=False)
    config = RunConfig.from_dict(state["config"])
    if config.finetune.lora:  # adapters alone: the base they fine-tune, with them folded in
        from cs336_basics.lora.merge import lora_model, merge_adapters

        model = merge_adapters(lora_model(checkpoint)[0])
    else:
        model = TransformerLM(config.model)
        load_checkpoint(checkpoint, model=model, restore_rng=False)
    if not (out_dir / "tokenizer").is_dir():
        raise ConfigError(f"{out_dir} has no tokenizer/ folder (the run trained on pre-tokenised arrays).")
    return model.to(device).eval(), BPETokenizer.load(out_dir / "tokenizer")


def sample_text(
    model: TransformerLM,
    tokenizer: BPETokenizer,
    prompt: str,
    max_new_tokens: int,
    temperature: float = 0.8,
    top_p: float = 0.95,
    seed: int = 0,
) -> str:
    device = next(model.parameters()).device
    prompt_ids = torch.tensor(tokenizer.encode(prompt), device=device)
    generator = torch.Generator(device=device).manual_seed(seed)
    model.eval()
    new_ids = model.generate(
        prompt_ids,
        max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        eos_token_id=tokenizer.eot_id,
        generator=generator,
    )
    return prompt + tokenizer.decode(new_ids.tolist())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out_dir", default="runs/default", help="the run folder written by train_h100.py")
    parser.add_argument("--prompt", default="def ")
    parser.add_argument("--max_new_tokens", type=int, default=200)
    parser.add_argument("--temperature", type=float, default=0.8, help="0 means greedy")
    parser.add_argument("--top_p", type=float, default=0.95)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto")
    args = parser.parse_args(argv)
    try:
        device = resolve_device(args.device)
        model, tokenizer = load_trained(Path(args.out_dir), device)
    except ConfigError as exc:
        return report_error(exc)
    print(sample_text(model, tokenizer, args.prompt, args.max_new_tokens, args.temperature, args.top_p, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
