"""CS336-style transformer language model with an honest BF16/FP8 training path.

The course's interface (``Tokenizer``, ``train_bpe``, ``TransformerLM``, ``AdamW``, ``save_checkpoint``, ...)
is importable from here; it lives in ``cs336_basics.course``. It is loaded on first use, so that importing
a light submodule (or starting a BPE worker process) does not import torch and the whole model; the tokenizer's
names come from their own modules, without torch.
"""

import importlib

_COURSE_NAMES = (
    "AdamW",
    "Embedding",
    "Linear",
    "MultiHeadSelfAttention",
    "RMSNorm",
    "RotaryPositionalEmbedding",
    "SwiGLU",
    "Tokenizer",
    "TransformerBlock",
    "TransformerLM",
    "cross_entropy",
    "get_batch",
    "get_lr_cosine_schedule",
    "gradient_clipping",
    "load_checkpoint",
    "save_checkpoint",
    "scaled_dot_product_attention",
    "silu",
    "softmax",
    "train_bpe",
)

__all__ = list(_COURSE_NAMES)


# The course's tokenizer, which needs no torch: from its own modules rather than through cs336_basics.course.
_TORCH_FREE = {"train_bpe": "cs336_basics.data.bpe", "Tokenizer": "cs336_basics.data.bpe_tokenizer"}


def __getattr__(name: str):
    if name in _COURSE_NAMES:
        return getattr(importlib.import_module(_TORCH_FREE.get(name, "cs336_basics.course")), name)
    raise AttributeError(f"module 'cs336_basics' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_COURSE_NAMES])
