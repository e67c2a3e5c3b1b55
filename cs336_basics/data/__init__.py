"""Data: tokenizer, corpora and caching, and batches of training windows.

Names are loaded on first use (PEP 562), so that the course's tokenizer (`data.bpe`, `data.bpe_tokenizer`) imports
without torch, which the batching and caching modules need."""

import importlib

_WHERE = {
    "BatchSampler": "batching",
    "get_batch": "batching",
    "get_rank_batch": "batching",
    "load_token_array": "batching",
    "require_windows": "batching",
    "token_dtype_for_vocab": "batching",
    "PreparedData": "sources",
    "check_data_sources": "sources",
    "default_cache_dir": "sources",
    "prepare_data": "sources",
    "stdlib_source_files": "sources",
    "END_OF_TEXT": "tokenizer",
    "BPETokenizer": "tokenizer",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(f"cs336_basics.data.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'cs336_basics.data' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
