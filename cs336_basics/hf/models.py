"""A Hugging Face causal LM built from its config (random weights), behind the forward our training code calls.

`hf_config(spec)` reads the config: a named shape of this module (`NAMED_SHAPES`: Llama-style configs that need no
file), a local directory holding a config.json, or a hub model id (only its config.json is fetched), and refuses a
config transformers builds no causal decoder of (causal_decoder_config). `CausalLM` wraps the transformers model so
that it is called as TransformerLM is: `model(input_ids)` gives logits and
`model(input_ids, targets=...)` the mean next-token loss, with the targets already shifted (as get_batch makes them),
so one batch means the same thing to both models.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from cs336_basics.config import with_fixed_shape
from cs336_basics.errors import ConfigError
from cs336_basics.model.functional import cross_entropy
from cs336_basics.model.transformer import sample_tokens
from cs336_basics.precision.support import HF_INSTALL_HINT

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
    """The transformers config `spec` names (see the module docstring), with `overrides` set on it; a ConfigError
    where it cannot be read or is not a causal decoder's (causal_decoder_config)."""
    transformers = require_transformers()
    if spec in NAMED_SHAPES:
        return causal_decoder_config(transformers.LlamaConfig(**{**NAMED_SHAPES[spec], **overrides}), spec)
    if Path(spec).is_dir():
        if not (Path(spec) / "config.json").is_file():
            raise ConfigError(f"--hf_model {spec}: the directory has no config.json.")
        try:
            config = transformers.AutoConfig.from_pretrained(spec, local_files_only=True, **overrides)
        except (OSError, ValueError, KeyError) as exc:  # not JSON, an unknown model_type
            raise ConfigError(
                f"--hf_model {spec}: transformers {transformers.__version__} cannot read its config.json "
                f"({_first_line(exc)})."
            ) from exc
        return causal_decoder_config(config, spec)
    try:
        config = transformers.AutoConfig.from_pretrained(spec, **overrides)
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(
            f"--hf_model {spec}: not a named shape ({', '.join(NAMED_SHAPES)}), not a local directory with a "
            f"config.json, and its config could not be fetched from the hub ({_first_line(exc)}). Offline, "
            "save the config with AutoConfig.from_pretrained(...).save_pretrained(DIR) and pass DIR."
        ) from exc
    return causal_decoder_config(config, spec)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


# BERT's encoder packaged for encoder-decoder models: causal only with is_decoder, as the masked-LM encoders are, but
# without a masked-LM head to recognise it by.
_ENCODERS_WITHOUT_MLM_HEAD = ("bert-generation",)


def causal_decoder_config(config: Any, spec: str) -> Any:
    """`config` if transformers builds a causal decoder of it, run by SDPA as build_causal_lm runs it; else a
    ConfigError naming its model type. A model whose positions see later tokens, trained on next-token targets,
    reads each answer: its loss falls and it learns nothing it could generate with."""
    transformers = require_transformers()
    kind = f"--hf_model {spec}: model type {config.model_type!r}"
    if type(config) not in transformers.MODEL_FOR_CAUSAL_LM_MAPPING:
        raise ConfigError(
            f"{kind} has no causal language model in transformers {transformers.__version__} (AutoModelForCausalLM "
            "builds none); --hf_model takes a decoder-only text model's config (llama, gpt2, mistral, ...)."
        )
    encoder = (
        type(config) in transformers.MODEL_FOR_MASKED_LM_MAPPING or config.model_type in _ENCODERS_WITHOUT_MLM_HEAD
    )
    if encoder and not config.is_decoder and not config.is_encoder_decoder:  # a seq2seq's causal LM is its decoder
        raise ConfigError(
            f"{kind} is an encoder: the causal-LM head transformers builds for it attends to later tokens, so "
            "next-token training would read each answer. Use a decoder-only model (or set is_decoder true in its "
            "config, which makes this one causal)."
        )
    if getattr(config, "is_causal", True) is False:
        raise ConfigError(
            f"{kind} with is_causal false in its config attends to later tokens, so next-token training would read "
            "each answer. Drop is_causal from the config (or set it true)."
        )
    model_class = transformers.MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    if not model_class._supports_sdpa:
        raise ConfigError(
            f"{kind}: transformers {transformers.__version__} runs {model_class.__name__} without SDPA attention, "
            "which the Hugging Face path builds every model with. Choose a model it runs with SDPA."
        )
    return config


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

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, **sampling: Any) -> torch.Tensor:
        """As TransformerLM.generate: the new token ids sampled after a 1-D prompt."""
        return sample_tokens(self, self.context_length, input_ids, max_new_tokens, **sampling)

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        """As TransformerLM's: shared tensors once; exclude_embeddings drops the input lookup table unless the
        lm_head shares it."""
        total = sum(p.numel() for p in self.parameters())
        embeddings = self.hf.get_input_embeddings().weight
        tied = embeddings is self.hf.get_output_embeddings().weight
        return total - embeddings.numel() if exclude_embeddings and not tied else total


def build_causal_lm(config: Any, device: torch.device | str = "cpu", dtype: torch.dtype = torch.bfloat16,
                    seed: int = 0) -> CausalLM:  # fmt: skip
    """The causal LM of `config` with random weights (seeded), on `device` in `dtype`, in training mode, attention by
    torch's SDPA. Initialised where it will live: no host copy of a large model, and on "meta" no memory at all."""
    transformers = require_transformers()
    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    return CausalLM(model).to(dtype=dtype).train()


def model_settings_from_hf(spec: str, model: dict[str, Any], explicit: dict[str, Any]) -> dict[str, Any]:
    """The model section of a run with --hf_model `spec`: the shape read from its config (for the summary, the
    FLOP count and MFU; the model itself is built from the config), the sequence length as resolved. `model` is
    the resolved section, `explicit` what the command line (or a config file) set. ConfigError where an explicit
    shape flag disagrees with the config, or the sequence is longer than the config's positions."""
    config = hf_config(spec)
    hidden, heads = config.hidden_size, config.num_attention_heads
    shape = {
        "vocab_size": config.vocab_size,
        "dim": hidden,
        "n_layers": config.num_hidden_layers,
        "n_heads": heads,
        "n_kv_heads": getattr(config, "num_key_value_heads", None) or heads,
        "intermediate_size": getattr(config, "intermediate_size", None) or 4 * hidden,
        "tie_embeddings": bool(getattr(config, "tie_word_embeddings", False)),
    }
    fix = "Drop those flags (or edit the config)."
    merged = with_fixed_shape(model, shape, explicit, f"--hf_model {spec}", "the config", fix)
    positions = getattr(config, "max_position_embeddings", None)
    if positions is not None and merged["context_length"] > positions:
        raise ConfigError(
            f"--hf_model {spec}: --context_length {merged['context_length']} is longer than the config's "
            f"max_position_embeddings ({positions}). Pass --context_length {positions} or less."
        )
    return merged


def check_hf_model_request(config: Any, launched: bool) -> None:
    """Refuse, with the reason, what a Hugging Face model cannot run here (`config` a RunConfig with hf_model set;
    `launched`: under torchrun). Checked when the run is planned, before anything is built (the FP8 path is refused
    where it is chosen, precision/choice.py)."""
    m, ft = config.model, config.finetune
    refusals = []
    if m.attention != "sdpa":
        refusals.append(f"--attention {m.attention}: the model runs transformers' SDPA attention; use --attention sdpa")
    if m.gradient_checkpointing:
        refusals.append("--gradient_checkpointing recomputes this package's blocks; drop it")
    if ft.init_from is not None:
        refusals.append("--init_from loads this package's checkpoints; a Hugging Face model starts from its config")
    if launched:
        refusals.append("torchrun: data parallelism wraps this package's blocks; run it in one process")
    if refusals:
        raise ConfigError(f"--hf_model {m.hf_model}: " + "; ".join(refusals) + ".")
