"""Data: tokenizer, corpora and caching, and batches of training windows."""

from cs336_basics.data.batching import (
    BatchSampler,
    get_batch,
    get_rank_batch,
    load_token_array,
    require_windows,
    token_dtype_for_vocab,
)
from cs336_basics.data.sources import (
    PreparedData,
    check_data_sources,
    default_cache_dir,
    prepare_data,
    stdlib_source_files,
)
from cs336_basics.data.tokenizer import END_OF_TEXT, BPETokenizer

__all__ = [
    "END_OF_TEXT",
    "BPETokenizer",
    "BatchSampler",
    "PreparedData",
    "check_data_sources",
    "default_cache_dir",
    "get_batch",
    "get_rank_batch",
    "load_token_array",
    "prepare_data",
    "require_windows",
    "stdlib_source_files",
    "token_dtype_for_vocab",
]
