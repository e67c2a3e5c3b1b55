"""The course's ``Tokenizer``: byte-level BPE over a given vocabulary and merge list, in pure Python.

``Tokenizer(vocab, merges, special_tokens)`` encodes text exactly as GPT-2's tokenizer does when given
GPT-2's vocabulary and merges: special tokens are split out first (longest first where they overlap),
the rest is cut into pre-tokens by GPT-2's pattern, and each pre-token's UTF-8 bytes are merged by
repeatedly applying the earliest-learned merge among adjacent pairs (every occurrence of it, left to
right) until none applies. Results for a pre-token are cached, which is where the speed comes from: real
text repeats its words.

Files use GPT-2's format (``vocab.json`` mapping token strings to ids, ``merges.txt`` with one merge per
line), with bytes shown as printable characters through GPT-2's byte-to-unicode table. This is also what
``BPETokenizer.save`` writes, so a tokenizer trained by the training script loads here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from functools import cache

from cs336_basics.data.bpe import merge_pair
from cs336_basics.data.pretokenize import (
    PRETOKEN_RE,
    special_token_regex,
    unique_special_tokens,
)

__all__ = ["Tokenizer", "gpt2_bytes_to_unicode"]

# Distinct pre-tokens remembered; the cache is dropped when full, which bounds memory on any input.
_CACHE_ENTRIES = 1 << 17
# encode_iterable encodes once this many characters are buffered (more when no cut point was found).
_STREAM_CHARS = 1 << 16


@cache
def gpt2_bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table from each byte to a printable character, used to write tokens as text in its files.

    Bytes that are already printable and not a space (``!``..``~``, ``¡``..``¬``, ``®``..``ÿ``) stand for
    themselves; the other 68 take the characters from U+0100 upwards, in byte order (space is ``Ġ``).
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    others = (b for b in range(256) if b not in table)
    table |= {b: chr(256 + k) for k, b in enumerate(others)}
    return table


class Tokenizer:
    """Byte-level BPE with the course's interface: ``encode``, ``encode_iterable``, ``decode``.

    Args:
        vocab: id -> token bytes. Every byte that the text contains must have a single-byte token.
        merges: the merged pairs in the order they were learned; each pair's concatenation must be in vocab.
        special_tokens: strings always encoded as one token each, never split or merged; those whose bytes
            are not in vocab are added with new ids after the largest one.

    Where several ids share the same bytes, encoding uses the smallest.
    """

    def __init__(
        self,
        vocab: dict[int, bytes],
        merges: list[tuple[bytes, bytes]],
        special_tokens: list[str] | None = None,
    ) -> None:
        self.vocab: dict[int, bytes] = dict(vocab)
        self.merges: list[tuple[bytes, bytes]] = list(merges)
        self.special_tokens: list[str] = unique_special_tokens(special_tokens)
        self._id_of: dict[bytes, int] = {}
        for i in sorted(self.vocab, reverse=True):
            self._id_of[self.vocab[i]] = i  # descending, so the smallest id wins
        for token in self.special_tokens:
            raw = token.encode("utf-8")
            if raw not in self._id_of:
                new_id = max(self.vocab, default=-1) + 1
                self.vocab[new_id] = raw
                self._id_of[raw] = new_id
        self._special_ids = {t: self._id_of[t.encode("utf-8")] for t in self.special_tokens}
        self._special_re = special_token_regex(self.special_tokens)
        self._longest_special = max((len(t) for t in self.special_tokens), default=0)
        self._byte_ids = [self._id_of.get(bytes([b])) for b in range(256)]
        # (left id, right id) -> (rank, merged id); the earliest merge of a pair is the one that counts.
        self._ranks: dict[tuple[int, int], tuple[int, int]] = {}
        for rank, (left, right) in enumerate(self.merges):
            ids = [self._id_of.get(t) for t in (left, right, left + right)]
            if None in ids:
                raise ValueError(
                    f"merge {rank} {(left, right)!r} needs tokens that are not in the vocabulary "
                    f"({[t for t, i in zip((left, right, left + right), ids, strict=True) if i is None]!r})."
                )
            self._ranks.setdefault((ids[0], ids[1]), (rank, ids[2]))
        self._cache: dict[str, list[int]] = {}

    # ------------------------------------------------------------------------------------------ files
    @classmethod
    def from_files(
        cls,
        vocab_filepath: str | os.PathLike,
        merges_filepath: str | os.PathLike,
        special_tokens: list[str] | None = None,
    ) -> Tokenizer:
        """Load GPT-2 style ``vocab.json`` and ``merges.txt`` (as written by :meth:`save`, GPT-2, HF).

        Vocabulary entries that are not in GPT-2's byte encoding are accepted only when they are one of
        ``special_tokens`` (HF stores its added tokens as plain text); they stand for their UTF-8 bytes.
        """
        decoder = {c: b for b, c in gpt2_bytes_to_unicode().items()}
        specials = set(unique_special_tokens(special_tokens))

        def to_bytes(token: str, where: str) -> bytes:
            if all(c in decoder for c in token):
                return bytes(decoder[c] for c in token)
            if token in specials:
                return token.encode("utf-8")
            raise ValueError(
                f"{where}: token {token!r} is not in GPT-2's byte encoding (nor one of the special tokens)."
            )

        with open(vocab_filepath, encoding="utf-8") as f:
            entries = json.load(f)
        if not isinstance(entries, dict):
            raise ValueError(f"{vocab_filepath}: expected a JSON object mapping token strings to ids.")
        vocab = {int(i): to_bytes(token, str(vocab_filepath)) for token, i in entries.items()}
        merges = []
        with open(merges_filepath, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                line = line.rstrip("\r\n")
                if not line or (n == 1 and line.startswith("#version")):
                    continue
                parts = line.split(" ")
                if len(parts) != 2:
                    raise ValueError(f"{merges_filepath}:{n}: expected two tokens separated by a space, got {line!r}.")
                where = f"{merges_filepath}:{n}"
                merges.append((to_bytes(parts[0], where), to_bytes(parts[1], where)))
        return cls(vocab, merges, special_tokens)

    def save(self, vocab_filepath: str | os.PathLike, merges_filepath: str | os.PathLike) -> None:
        """Write ``vocab.json`` and ``merges.txt`` in GPT-2's format (readable by :meth:`from_files`)."""
        table = gpt2_bytes_to_unicode()

        def to_text(token: bytes) -> str:
            return "".join(table[b] for b in token)

        # json cannot hold two ids for one string; such duplicates are the later copies of a merged token.
        entries = {to_text(self.vocab[i]): i for i in sorted(self.vocab, reverse=True)}
        with open(vocab_filepath, "w", encoding="utf-8") as f:
            json.dump(dict(sorted(entries.items(), key=lambda kv: kv[1])), f, ensure_ascii=False)
        with open(merges_filepath, "w", encoding="utf-8") as f:
            f.write("#version: 0.2\n")
            f.writelines(f"{to_text(a)} {to_text(b)}\n" for a, b in self.merges)

    # ------------------------------------------------------------------------------------ encode/decode
    def encode(self, text: str) -> list[int]:
        """The token ids of ``text``."""
        ids, _ = self._encode_prefix(text, final=True)
        return ids

    def encode_iterable(self, iterable: Iterable[str]) -> Iterator[int]:
        """Lazily yield the ids of the concatenated strings (e.g. an open text file, line by line).

        The result equals ``encode("".join(iterable))``: text is buffered only until a point where the
        tokens before it cannot depend on what follows, so memory stays bounded by the buffer size plus the
        longest pre-token, whatever the input's length.
        """
        buffer, threshold = "", _STREAM_CHARS
        for chunk in iterable:
            if not isinstance(chunk, str):
                raise TypeError(f"encode_iterable expects strings, got {type(chunk).__name__}.")
            buffer += chunk
            if len(buffer) < threshold:
                continue
            ids, used = self._encode_prefix(buffer, final=False)
            yield from ids
            buffer = buffer[used:]
            # A long text with no cut point (one huge pre-token) is rescanned only after it doubles.
            threshold = max(_STREAM_CHARS, 2 * len(buffer))
        yield from self._encode_prefix(buffer, final=True)[0]

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids``; byte sequences that are not valid UTF-8 become U+FFFD."""
        try:
            raw = b"".join([self.vocab[i] for i in ids])
        except KeyError as e:
            raise ValueError(f"token id {e.args[0]!r} is not in the vocabulary.") from None
        return raw.decode("utf-8", errors="replace")

    # ---------------------------------------------------------------------------------------- internals
    def _encode_prefix(self, text: str, final: bool) -> tuple[list[int], int]:
        """Encode ``text``, or with ``final=False`` only the longest prefix whose tokens no continuation of
        the text can change; return the ids and the length of the prefix encoded.
        """
        ids: list[int] = []
        n = len(text)
        start = 0
        if self._special_re is not None:
            for m in self._special_re.finditer(text):
                if not final and m.start() + self._longest_special > n:
                    break  # more text could turn this into a longer special token
                self._encode_ordinary(text, start, m.start(), ids, None)
                ids.append(self._special_ids[m.group()])
                start = m.end()
        if final:
            self._encode_ordinary(text, start, n, ids, None)
            return ids, n
        # Beyond this point a special token may yet begin, ending the ordinary text there.
        horizon = n - max(self._longest_special - 1, 0)
        return ids, self._encode_ordinary(text, start, n, ids, horizon)

    def _encode_ordinary(self, text: str, start: int, end: int, ids: list[int], bound: int | None) -> int:
        """Append the ids of ``text[start:end]`` (no special tokens inside) to ``ids``; return where it stopped.

        With ``bound``, stop at the first pre-token whose match may have read text at or past ``bound``: a
        run reads the character after its end, a whitespace run given back to the next pre-token the one after
        that, and a contraction three characters from its start (which is at most one before its end).
        """
        cache = self._cache
        if bound is None:
            for piece in PRETOKEN_RE.findall(text, start, end):
                token_ids = cache.get(piece)
                if token_ids is None:
                    token_ids = self._merge_pretoken(piece)
                ids.extend(token_ids)
            return end
        for m in PRETOKEN_RE.finditer(text, start, end):
            if m.end() + 2 > bound:
                return m.start()
            piece = m.group()
            token_ids = cache.get(piece)
            if token_ids is None:
                token_ids = self._merge_pretoken(piece)
            ids.extend(token_ids)
        return end

    def _merge_pretoken(self, piece: str) -> list[int]:
        raw = piece.encode("utf-8")
        parts = [self._byte_ids[b] for b in raw]
        if None in parts:
            missing = sorted({b for b in raw if self._byte_ids[b] is None})
            raise ValueError(f"bytes {[hex(b) for b in missing]} of {piece!r} have no token in the vocabulary.")
        ranks = self._ranks
        while len(parts) > 1:
            best = None
            for pair in zip(parts, parts[1:], strict=False):
                found = ranks.get(pair)
                if found is not None and (best is None or found[0] < best[1][0]):
                    best = (pair, found)
            if best is None:
                break
            (left, right), (_, merged) = best
            parts = merge_pair(parts, left, right, merged)
        if len(self._cache) >= _CACHE_ENTRIES:
            self._cache.clear()
        self._cache[piece] = parts
        return parts
