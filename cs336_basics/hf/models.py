"""A Hugging Face causal LM built from its config (random weights), behind the forward our training code calls.

`hf_config(spec)` reads the config: a named shape of this module (`NAMED_SHAPES`: Llama-style configs that need no
file), a local directory holding a config.json, or a hub model id (only its config.json is fetched). `CausalLM`
wraps the transformers model so that it is called as TransformerLM is: `model(input_ids)` gives logits and
`model(input_ids, targets=...)` the mean next-token loss, with the targets already shifted (as get_batch makes them),
so one batch means the same thing to both models.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from cs336_basics.errors import ConfigError
from cs336_basics.model.functional import cross_entropy

HF_INSTALL_HINT = "install the hf extra: uv sync --extra hf"

# Llama-style shapes for the doctor, named by size. llama-1b is TinyLlama-1.1B's shape (its config.json on the hub:
# d=2048, 22 layers, 32 heads, 4 KV heads, ffn 5632); llama-125m is GPT-2 small's width and depth with Llama's
# blocks; llama-tiny is for tests.
_LLAMA_COMMON = {"vocab_size": 32000, "max_position_embeddings": 2048, "tie_word_embeddings": False}
NAMED_SHAPES: dict[str, dict[str, Any]] = {
    "llama-tiny": {"hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 256,
                   "tie_word_embeddings": False},
    "llama-125m": {"hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 12, "num_attention_heads": 12,
                   "num_key_value_heads": 12, **_LLAMA_COMMON},
    "llama-1b": {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22, "num_attention_heads": 32,
                 "num_key_value_heads": 4, **_LLAMA_COMMON},
}  # fmt: skip


def require_transformers() -> Any:
    """The transformers module, or a ConfigError saying how to install it."""
    try:
        import transformers
    except ImportError as exc:
        raise ConfigError(f"Hugging Face models need transformers, which is not installed: {HF_INSTALL_HINT}.") from exc
    return transformers


def hf_config(spec: str, **overrides: Any) -> Any:
    """The transformers config `spec` names (see the module docstring), with `overrides` set on it."""
    transformers = require_transformers()
    if spec in NAMED_SHAPES:
        return transformers.LlamaConfig(**{**NAMED_SHAPES[spec], **overrides})
    if Path(spec).is_dir():
        if not (Path(spec) / "config.json").is_file():
            raise ConfigError(f"--hf_model {spec}: the directory has no config.json.")
        return transformers.AutoConfig.from_pretrained(spec, local_files_only=True, **overrides)
    try:
        return transformers.AutoConfig.from_pretrained(spec, **overrides)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"--hf_model {spec}: not a named shape ({', '.join(NAMED_SHAPES)}), not a local directory with a "
            f"config.json, and its config could not be fetched from the hub ({type(exc).__name__}: {exc}). Offline, "
            "save the config with AutoConfig.from_pretrained(...).save_pretrained(DIR) and pass DIR."
        ) from exc


class CausalLM(nn.Module):
    """A transformers causal LM called as TransformerLM is (the module docstring says why)."""

    def __init__(self, hf_model: nn.Module):
        super().__init__()
        self.hf = hf_model

    @property
    def context_length(self) -> int:
        return int(self.hf.config.max_position_embeddings)

    @property
    def vocab_size(self) -> int:
        return int(self.hf.config.vocab_size)

    def forward(self, input_ids: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        logits = self.hf(input_ids=input_ids, use_cache=False).logits
        return logits if targets is None else cross_entropy(logits, targets)

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        """As TransformerLM's: shared tensors once; exclude_embeddings drops the input lookup table unless the
        lm_head shares it."""
        total = sum(p.numel() for p in self.parameters())
        embeddings = self.hf.get_input_embeddings().weight
        tied = embeddings is self.hf.get_output_embeddings().weight
        return total - embeddings.numel() if exclude_embeddings and not tied else total


def build_causal_lm(config: Any, device: torch.device | str = "cpu", dtype: torch.dtype = torch.bfloat16,
                    seed: int = 0) -> CausalLM:  # fmt: skip
    """The causal LM of `config` with random weights (seeded), on `device` in `dtype`, in training mode."""
    transformers = require_transformers()
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    return CausalLM(model).to(device=device, dtype=dtype).train()
