"""GPT-2 pre-tokenization and special-token splitting: the rules every byte-level BPE here shares.

Text is first split on special tokens (so nothing merges across them), then each piece is cut into
pre-tokens by GPT-2's regular expression; BPE merges never cross a pre-token boundary.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import regex

# GPT-2's pre-tokenizer: contractions, an optional space + a run of letters, of digits, or of other
# non-space characters, then whitespace (a run not followed by a non-space, else a lone whitespace run).
GPT2_SPLIT_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
PRETOKEN_RE = regex.compile(GPT2_SPLIT_PATTERN)

# A space or newline with a printable, non-space ASCII character on both sides. Text may be cut just before
# it without changing its pre-tokens: the piece on the left ends with a letter, digit or punctuation run that
# cannot take in a following space, and `` x`` / ``\nx`` start a new pre-token whatever precedes them. Cuts
# inside whitespace runs are not safe (``\s+(?!\S)`` matches differently at the end of a string), which is
# why both neighbours must be plain ASCII and never whitespace, under any regex's Unicode rules.
SAFE_CUT_BYTES = re.compile(rb"(?<=[\x21-\x7e])[ \n](?=[\x21-\x7e])")


def unique_special_tokens(special_tokens: Iterable[str] | None) -> list[str]:
    """The special tokens in order of first appearance, duplicates dropped; empty strings are an error."""
    tokens = list(dict.fromkeys(special_tokens or ()))
    for token in tokens:
        if not isinstance(token, str) or not token:
            raise ValueError(f"special tokens must be non-empty strings, got {token!r}.")
    return tokens


def special_token_regex(special_tokens: Iterable[str]) -> regex.Pattern | None:
    """A pattern matching any special token, longest first where several match at one place; None for none.

    Longest first makes ``<|endoftext|><|endoftext|>`` one token when it is itself a special token.
    """
    tokens = sorted(unique_special_tokens(special_tokens), key=len, reverse=True)
    if not tokens:
        return None
    return regex.compile("|".join(regex.escape(t) for t in tokens))
