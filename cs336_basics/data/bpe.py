"""Course-exact byte-level BPE training: ``train_bpe(input_path, vocab_size, special_tokens)``.

The rules are the course's: the vocabulary starts with the special tokens, then the 256 single bytes, then
one token per merge in the order learned; text is split on the special tokens first (nothing merges across
them, and they are not counted), each piece is cut into GPT-2 pre-tokens, and merges never cross a
pre-token. At each step the most frequent adjacent pair is merged; ties go to the lexicographically
greater pair, compared as ``(bytes, bytes)``.

HF ``tokenizers`` (what ``BPETokenizer.train`` and the training script use) breaks ties differently, so
its merges differ from these on real text; use this trainer when the course's merges are what you need.

Speed: pre-tokenization runs in parallel processes over chunks of the file cut where the pre-tokens cannot
change (at a special token, or at ``SAFE_CUT_BYTES``), and the merge loop updates pair counts
incrementally: an index from each pair to the words that hold it means a merge touches only the words
containing the merged pair, and a heap with lazy deletion yields the next best pair.
"""

from __future__ import annotations

import heapq
import os
import warnings
from collections import Counter
from multiprocessing import get_context
from pathlib import Path

from cs336_basics.data.pretokenize import (
    PRETOKEN_RE,
    SAFE_CUT_BYTES,
    special_token_regex,
    unique_special_tokens,
)

__all__ = ["merge_pair", "pretoken_counts", "train_bpe", "usable_cores"]

# Chunks per worker process: more than one keeps both cores busy when chunks take unequal time.
_CHUNKS_PER_PROCESS = 4
# Below this much text per chunk, process start-up costs more than the parallelism saves.
_MIN_CHUNK_BYTES = 1 << 20
# How much of the file is read at a time while looking for a chunk boundary.
_SEARCH_BYTES = 1 << 16


def train_bpe(
    input_path: str | os.PathLike,
    vocab_size: int,
    special_tokens: list[str],
    *,
    num_processes: int | None = None,
) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """Train a byte-level BPE on a UTF-8 text file, with the course's rules (see the module docstring).

    Returns ``(vocab, merges)``: ``vocab`` maps ids to bytes (special tokens from 0, then the 256 bytes,
    then one id per merge), ``merges`` lists the merged pairs in the order they were learned. ``vocab_size``
    counts everything; if the text runs out of pairs first, the result is smaller and a warning says so.
    ``num_processes`` (default: the usable cores) only changes the speed, never the result.
    """
    path = Path(input_path)
    if not path.is_file():
        raise FileNotFoundError(f"BPE training text {path} does not exist or is not a file.")
    specials = unique_special_tokens(special_tokens)
    n_merges = vocab_size - 256 - len(specials)
    if n_merges < 0:
        raise ValueError(
            f"vocab_size {vocab_size} is too small: it must hold the 256 byte tokens and the "
            f"{len(specials)} special token(s), so at least {256 + len(specials)}."
        )
    counts = pretoken_counts(path, specials, num_processes)
    vocab: dict[int, bytes] = {i: token.encode("utf-8") for i, token in enumerate(specials)}
    vocab |= {len(specials) + b: bytes([b]) for b in range(256)}
    merges = _learn_merges(counts, vocab, n_merges)
    if len(merges) < n_merges:
        warnings.warn(
            f"the text ran out of pairs to merge after {len(merges)} merges; the vocabulary has {len(vocab)} "
            f"tokens, not the {vocab_size} asked for.",
            stacklevel=2,
        )
    return vocab, merges


# ---------------------------------------------------------------------------------------- pre-tokenization
def pretoken_counts(path: Path, special_tokens: list[str], num_processes: int | None = None) -> Counter[str]:
    """How often each GPT-2 pre-token occurs in the file, with the special tokens split out and not counted."""
    processes = num_processes or usable_cores()
    size = path.stat().st_size
    n_chunks = max(1, min(processes * _CHUNKS_PER_PROCESS, size // _MIN_CHUNK_BYTES))
    bounds = _chunk_bounds(path, n_chunks, special_tokens)
    tasks = [(str(path), start, end, special_tokens) for start, end in zip(bounds, bounds[1:], strict=False)]
    total: Counter[str] = Counter()
    if processes == 1 or len(tasks) == 1:
        for task in tasks:
            total.update(_count_chunk(task))
        return total
    with get_context().Pool(min(processes, len(tasks))) as pool:
        for counts in pool.imap_unordered(_count_chunk, tasks):
            total.update(counts)
    return total


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _count_chunk(task: tuple[str, int, int, list[str]]) -> Counter[str]:
    path, start, end, special_tokens = task
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(
            f"{path} is not valid UTF-8 (byte offset {start + e.start}: {e.reason}); BPE training reads UTF-8 text."
        ) from None
    specials = special_token_regex(special_tokens)
    pieces = specials.split(text) if specials is not None else [text]
    counts: Counter[str] = Counter()
    for piece in pieces:
        counts.update(PRETOKEN_RE.findall(piece))
    return counts


def _chunk_bounds(path: Path, n_chunks: int, special_tokens: list[str]) -> list[int]:
    """Byte offsets ``0 = b0 < b1 < ... = size`` cutting the file into about ``n_chunks`` pieces whose
    pre-tokens, counted apart, are exactly those of the whole file.

    Each cut is the first place at or after an even split point that is the start of a special-token
    match or a ``SAFE_CUT_BYTES`` position, and that no special-token occurrence straddles. Both kinds of
    cut fall on character boundaries. Where none is found, neighbouring chunks simply merge.
    """
    size = path.stat().st_size
    encoded = [t.encode("utf-8") for t in special_tokens]
    longest = max((len(t) for t in encoded), default=1)
    bounds = [0]
    with open(path, "rb") as f:
        for k in range(1, n_chunks):
            target = max(size * k // n_chunks, bounds[-1] + 1)
            if target >= size:
                break
            cut = _next_cut(f, target, size, encoded, longest)
            if cut > bounds[-1] and cut < size:
                bounds.append(cut)
    bounds.append(size)
    return bounds


def _next_cut(f, target: int, size: int, specials: list[bytes], longest: int) -> int:
    """The first valid cut at or after ``target`` (see _chunk_bounds), or ``size`` if there is none."""
    pos = target
    while pos < size:
        # Read a little before pos (the safe-cut lookbehind, straddling tokens) and after (lookahead).
        lo = max(0, pos - longest)
        f.seek(lo)
        buf = f.read(pos - lo + _SEARCH_BYTES + longest)
        candidates = [m.start() for m in SAFE_CUT_BYTES.finditer(buf, pos - lo)]
        for token in specials:
            i = buf.find(token, pos - lo)
            while i != -1:
                candidates.append(i)
                i = buf.find(token, i + 1)
        for c in sorted(candidates):
            if lo + c >= size or c > pos - lo + _SEARCH_BYTES:
                break
            if not any(buf.find(t, max(0, c - len(t) + 1), c + len(t) - 1) != -1 for t in specials):
                return lo + c
        pos += _SEARCH_BYTES
    return size


# ---------------------------------------------------------------------------------------------- merging
def _descending(token: bytes) -> tuple[int, ...]:
    """A key that sorts byte strings in reverse lexicographic order (a prefix sorts after its extensions)."""
    return (*(-b for b in token), 1)


def _learn_merges(counts: Counter[str], vocab: dict[int, bytes], n_merges: int) -> list[tuple[bytes, bytes]]:
    """Run the merge loop, adding one token per merge to ``vocab`` (in place); return the merges."""
    offset = len(vocab) - 256  # id of byte 0
    # Tokens are identified by their bytes: if a merge rebuilds bytes that already have a token (two merge
    # orders reaching one string), words use the earlier id, as a bytes-level trainer would, while the
    # vocabulary still gets its entry for the merge.
    id_of = {b: i for i, b in sorted(vocab.items(), reverse=True)}
    order = {i: _descending(b) for i, b in vocab.items()}

    words: list[list[int]] = []
    freqs: list[int] = []
    for text, n in counts.items():
        raw = text.encode("utf-8")
        if len(raw) > 1:  # a single byte has no pair to merge
            words.append([offset + b for b in raw])
            freqs.append(n)

    pair_counts: dict[tuple[int, int], int] = {}
    where: dict[tuple[int, int], set[int]] = {}
    for w, (word, n) in enumerate(zip(words, freqs, strict=True)):
        for pair in zip(word, word[1:], strict=False):
            pair_counts[pair] = pair_counts.get(pair, 0) + n
            where.setdefault(pair, set()).add(w)
    # Max-heap by (count, (bytes_a, bytes_b)) built from min-heap keys; stale entries are skipped on pop.
    heap = [(-n, order[a], order[b], a, b) for (a, b), n in pair_counts.items()]
    heapq.heapify(heap)

    merges: list[tuple[bytes, bytes]] = []
    while len(merges) < n_merges and heap:
        neg, _, _, a, b = heapq.heappop(heap)
        if pair_counts.get((a, b)) != -neg:
            continue  # stale: the pair's count changed after this entry was pushed
        merged = vocab[a] + vocab[b]
        new_id = len(vocab)
        vocab[new_id] = merged
        merges.append((vocab[a], vocab[b]))
        token = id_of.setdefault(merged, new_id)
        order[token] = _descending(merged)

        delta: dict[tuple[int, int], int] = {}
        for w in where.pop((a, b)):
            word, n = words[w], freqs[w]
            new = merge_pair(word, a, b, token)
            old_pairs = list(zip(word, word[1:], strict=False))
            new_pairs = list(zip(new, new[1:], strict=False))
            for pair in old_pairs:
                delta[pair] = delta.get(pair, 0) - n
            for pair in new_pairs:
                delta[pair] = delta.get(pair, 0) + n
            old_set, new_set = set(old_pairs), set(new_pairs)
            for pair in old_set - new_set - {(a, b)}:
                where[pair].discard(w)
            for pair in new_set - old_set:
                where.setdefault(pair, set()).add(w)
            words[w] = new
        for pair, d in delta.items():
            if not d:
                continue  # e.g. a pair elsewhere in an affected word
            n = pair_counts.get(pair, 0) + d
            if n:
                pair_counts[pair] = n
                heapq.heappush(heap, (-n, order[pair[0]], order[pair[1]], *pair))
            else:  # no word holds the pair any more
                del pair_counts[pair]
                where.pop(pair, None)
    return merges


def merge_pair(word: list[int], a: int, b: int, token: int) -> list[int]:
    """``word`` with every occurrence of the pair (a, b) replaced by ``token``, scanning left to right
    (so ``a a a`` merged as (a, a) gives ``aa a``). Training and encoding both apply merges this way."""
    out = []
    i, n = 0, len(word)
    while i < n:
        if i + 1 < n and word[i] == a and word[i + 1] == b:
            out.append(token)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out
