"""The CS336 assignment's interface, as thin entry points over this package's own code.

Everything here is also importable from ``cs336_basics`` itself:

- tokenization: ``Tokenizer`` (vocab, merges, special_tokens; ``from_files``, ``encode``, ``encode_iterable``,
  ``decode``) and ``train_bpe`` (input_path, vocab_size, special_tokens) -> (vocab, merges);
- functions: ``softmax``, ``silu``, ``cross_entropy``, ``scaled_dot_product_attention``, ``gradient_clipping``,
  ``get_lr_cosine_schedule``, ``get_batch``;
- modules: ``Linear``, ``Embedding``, ``RMSNorm``, ``SwiGLU``, ``RotaryPositionalEmbedding``,
  ``MultiHeadSelfAttention``, ``TransformerBlock``, ``TransformerLM``;
- training: ``AdamW``, ``save_checkpoint``, ``load_checkpoint``.
"""

from cs336_basics.course.checkpoint import load_checkpoint, save_checkpoint
from cs336_basics.course.functional import (
    cross_entropy,
    get_batch,
    get_lr_cosine_schedule,
    gradient_clipping,
    scaled_dot_product_attention,
    silu,
    softmax,
)
from cs336_basics.course.modules import (
    Embedding,
    Linear,
    MultiHeadSelfAttention,
    RMSNorm,
    RotaryPositionalEmbedding,
    SwiGLU,
    TransformerBlock,
    TransformerLM,
)
from cs336_basics.course.optim import AdamW
from cs336_basics.data.bpe import train_bpe
from cs336_basics.data.bpe_tokenizer import Tokenizer

__all__ = [
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
]
