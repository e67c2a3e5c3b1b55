"""Sampling from a trained model: the settings (checked like every config field: declared once, with its range) and
the sampler. Training samples a line of text at its end; `python -m cs336_basics.programs.generate` samples from a
run folder."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cs336_basics.config import at_least, finite, non_negative, seed_value, setting, validate_fields
from cs336_basics.data import BPETokenizer


def _some_text(v: str) -> str | None:
    return None if v else "must not be empty (the model continues a text)"


def _probability_mass(v: float) -> str | None:
    return None if 0 < v <= 1 else "must be in (0, 1]"


@dataclass(frozen=True)
class Sampling:
    prompt: str = setting("def ", "the text to continue", check=_some_text)
    max_new_tokens: int = setting(200, "tokens to sample after the prompt", check=at_least(1))
    temperature: float = setting(0.8, "softmax temperature; 0 is greedy decoding", check=finite(non_negative))
    top_k: int = setting(0, "sample from the k most likely tokens only; 0 keeps them all", check=at_least(0))
    top_p: float = setting(
        0.95, "sample from the fewest most likely tokens whose probability reaches top_p", check=_probability_mass
    )
    seed: int = setting(0, "seed of the sampling generator", check=seed_value)

    def __post_init__(self) -> None:
        validate_fields(self)


def sample_text(model: torch.nn.Module, tokenizer: BPETokenizer, sampling: Sampling) -> str:
    """`sampling.prompt` and what `model` (TransformerLM or hf.models.CausalLM: both generate) samples after it."""
    device = next(model.parameters()).device
    prompt_ids = torch.tensor(tokenizer.encode(sampling.prompt), device=device)
    generator = torch.Generator(device=device).manual_seed(sampling.seed)
    model.eval()
    new_ids = model.generate(
        prompt_ids,
        sampling.max_new_tokens,
        temperature=sampling.temperature,
        top_k=sampling.top_k,
        top_p=sampling.top_p,
        eos_token_id=tokenizer.eot_id,
        generator=generator,
    )
    return sampling.prompt + tokenizer.decode(new_ids.tolist())
