"""Byte-level BPE tokenizer (GPT-2 style) on top of Hugging Face ``tokenizers``.

The Rust library does the heavy lifting: training and batch encoding run on all cores. This module adds
the course's conventions (``<|endoftext|>`` as the one special token, uint16/uint32 token arrays) and
streaming so that a multi-GB text file is encoded with bounded memory.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from tqdm.auto import tqdm

from cs336_basics.data.batching import token_dtype_for_vocab
from cs336_basics.data.bpe import usable_cores
from cs336_basics.data.pretokenize import SAFE_CUT_BYTES
from cs336_basics.errors import ConfigError
from cs336_basics.files.atomic import temp_prefix

END_OF_TEXT = "<|endoftext|>"

# A file is read in blocks of this size and cut into chunks on safe boundaries (see _safe_cut): chunks are
# the unit of parallelism for the batched encode (Rust threads), so a single huge file still keeps every core busy.
_CHUNK_BYTES = 256 << 10
# Chunks per core handed to one batched encode: enough to balance the threads' work within a batch.
# Memory is what bounds it: Encoding objects hold each token's string and offsets besides its id, so a batch
# costs many times its text size.
_CHUNKS_PER_CORE = 4
_MIN_BATCH_BYTES = 4 << 20
# Give up looking for an exact boundary once the carried-over text reaches this many chunks (text with no
# ASCII word breaks at all, e.g. some CJK text); see _iter_file_chunks.
_MAX_CARRY_CHUNKS = 8

# (text, n_bytes, is_last_chunk_of_its_file): a piece of one document, as encode_files batches it.
_Chunk = tuple[str, int, bool]


def _safe_cut(buf: bytes) -> int:
    """The last offset at which ``buf`` can be split without changing its tokenisation, or -1.

    The rule (and why it is exact) is ``SAFE_CUT_BYTES``'s, shared with the course-exact BPE trainer.
    """
    # Look at the tail first: a match is almost always near the end, and the regex has no reverse search.
    window = 4096
    while True:
        start = max(0, len(buf) - window)
        matches = list(SAFE_CUT_BYTES.finditer(buf, start))
        if matches:
            return matches[-1].start()
        if start == 0:
            return -1
        window *= 16


def _iter_file_chunks(path: Path, chunk_bytes: int | None = None) -> Iterator[tuple[str, int]]:
    """Yield ``(text, n_bytes)`` pieces of a file, cut at safe word boundaries, each about ``chunk_bytes``.

    Cuts fall before an ASCII space or newline, always a UTF-8 character boundary, so each piece decodes on
    its own. Invalid UTF-8 (e.g. test fixtures in the standard library) becomes U+FFFD rather than an error.
    """
    # Module constants are read per call (not as defaults) so tests can shrink them to exercise chunking.
    chunk_bytes = chunk_bytes or _CHUNK_BYTES
    max_carry = _MAX_CARRY_CHUNKS * chunk_bytes
    with open(path, "rb") as f:
        carry = b""
        while True:
            block = f.read(chunk_bytes)
            if not block:
                break
            buf = carry + block
            cut = _safe_cut(buf)
            if cut <= 0:
                if len(buf) < max_carry:
                    carry = buf
                    continue
                # No exact boundary in sight: cut after any newline to keep memory bounded. At worst the
                # few tokens around this one seam differ from encoding the file whole.
                cut = buf.rfind(b"\n") + 1
                if cut <= 0:
                    # Not even a newline: back off to a UTF-8 character start (not a continuation byte).
                    cut = len(buf) - 1
                    while cut > 0 and (buf[cut] & 0xC0) == 0x80:
                        cut -= 1
                    cut = cut or len(buf)
            yield buf[:cut].decode("utf-8", errors="replace"), cut
            carry = buf[cut:]
        if carry:
            yield carry.decode("utf-8", errors="replace"), len(carry)


def check_bpe_vocab(vocab_size: int) -> None:
    """A vocabulary a byte-level BPE can have: its 256 byte tokens and END_OF_TEXT at least."""
    min_size = 256 + 1
    if vocab_size < min_size:
        raise ConfigError(
            f"vocab_size {vocab_size} is too small for byte-level BPE: it needs 256 byte tokens plus {END_OF_TEXT}, "
            f"so at least {min_size}."
        )


def _check_files(files: Iterable[str | Path]) -> list[Path]:
    paths = [Path(f) for f in files]
    for p in paths:
        if not p.is_file():
            raise ConfigError(f"Text file {p} does not exist; check the path.")
    return paths


def _os_error(exc: Exception, path: Path) -> OSError | None:
    """The library's I/O failure as the OSError it was (None for any other failure): it raises a plain Exception
    reading "... (os error 28)", which no OSError handler (the run folder's write guard) would catch."""
    code = re.search(r"\(os error (\d+)\)$", str(exc))
    if code is None:
        return None
    number = int(code.group(1))
    return OSError(number, os.strerror(number), str(path))


class BPETokenizer:
    """GPT-2 style byte-level BPE with ``<|endoftext|>`` as its single special token."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        eot = tokenizer.token_to_id(END_OF_TEXT)
        if eot is None:
            raise ConfigError(
                f"This tokenizer has no {END_OF_TEXT} token; train one with BPETokenizer.train, which adds it."
            )
        self._tok = tokenizer
        self._eot_id = eot

    # ----------------------------------------------------------------------------------- construction
    @staticmethod
    def _empty() -> Tokenizer:
        tok = Tokenizer(models.BPE())
        # use_regex=True is the GPT-2 split (contractions, letter runs, digit runs, punctuation, spaces);
        # no prefix space, so decode(encode(s)) == s exactly and text can be encoded in chunks (_safe_cut).
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        return tok

    @classmethod
    def train(cls, files: list[Path], vocab_size: int, show_progress: bool = True) -> BPETokenizer:
        """Train on text files. ``vocab_size`` counts the 256 byte tokens and ``<|endoftext|>``."""
        paths = _check_files(files)
        check_bpe_vocab(vocab_size)
        tok = cls._empty()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=[END_OF_TEXT],
            # All 256 bytes up front, so any text (including bytes unseen in training) can be encoded.
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            # Its bars draw on a terminal only: written to a log file, they are blank lines.
            show_progress=show_progress and sys.stderr.isatty(),
        )
        tok.train_from_iterator(_training_texts(paths), trainer=trainer)
        return cls(tok)

    @classmethod
    def load(cls, directory: str | Path) -> BPETokenizer:
        """Load from a folder written by :meth:`save` (or a ``tokenizer.json`` path)."""
        directory = Path(directory)
        path = directory if directory.suffix == ".json" else directory / "tokenizer.json"
        if not path.is_file():
            raise ConfigError(
                f"No tokenizer found at {path}; point at a folder written by BPETokenizer.save "
                "(it holds tokenizer.json), or train a new tokenizer."
            )
        try:
            tok = Tokenizer.from_file(str(path))
        except Exception as exc:  # the Rust side raises a bare Exception for malformed JSON
            raise ConfigError(f"Cannot read tokenizer {path} ({exc}); delete it and train again.") from exc
        return cls(tok)

    def save(self, directory: str | Path) -> Path:
        """Write ``tokenizer.json`` (HF format) plus GPT-2 style ``vocab.json`` and ``merges.txt``.

        Each file is written to a temporary name first and moved into place, so a reader never sees a
        half-written file.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=directory, prefix=temp_prefix("tokenizer")))
        try:
            try:
                self._tok.save(str(tmp / "tokenizer.json"))
                self._tok.model.save(str(tmp))  # writes vocab.json and merges.txt
            except Exception as exc:
                error = _os_error(exc, directory)
                if error is None:
                    raise
                raise error from exc
            # tokenizer.json last: its presence is what load() and the data cache take as "complete".
            for name in ("vocab.json", "merges.txt", "tokenizer.json"):
                os.replace(tmp / name, directory / name)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return directory

    def __eq__(self, other: object) -> bool:
        """Same vocabulary, merges, special tokens and pre-/post-processing: encodes every text the same way."""
        return isinstance(other, BPETokenizer) and self._tok.to_str() == other._tok.to_str()

    __hash__ = None  # mutable wrapper: equality by content, no hashing

    # ---------------------------------------------------------------------------------- encode/decode
    @property
    def eot_id(self) -> int:
        return self._eot_id

    @property
    def vocab_size(self) -> int:
        """The real vocabulary size (smaller than requested when the training corpus ran out of pairs)."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def hf_tokenizer(self) -> Tokenizer:
        """The underlying ``tokenizers.Tokenizer``, for anything this wrapper does not expose."""
        return self._tok

    def encode(self, text: str) -> list[int]:
        # add_special_tokens=False only disables post-processor templates; <|endoftext|> in the text is
        # still matched as one token.
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def encode_files(
        self,
        files: list[Path],
        out_path: str | Path,
        append_eot: bool = True,
        show_progress: bool = True,
    ) -> Path:
        """Encode text files (one document each) into one ``.npy`` token array, written atomically.

        Files are streamed in line-aligned chunks, encoded in parallel batches, and appended to a raw
        temporary file, so memory stays bounded whatever the corpus size. The finished stream is then
        wrapped as ``.npy`` and moved into place with ``os.replace``: a crash leaves no partial array.
        """
        paths = _check_files(files)
        out_path = Path(out_path)
        out_path.parent.mkdir(parents=True, exist_ok=True)
        dtype = token_dtype_for_vocab(self.vocab_size)
        eot = np.array([self._eot_id], dtype=dtype) if append_eot else None
        total_bytes = sum(p.stat().st_size for p in paths)

        batch_bytes = max(_MIN_BATCH_BYTES, _CHUNKS_PER_CORE * usable_cores() * _CHUNK_BYTES)

        raw_fd, raw_name = tempfile.mkstemp(dir=out_path.parent, prefix=temp_prefix(out_path.stem), suffix=".bin")
        npy_name = raw_name[: -len(".bin")] + ".npy"
        try:
            with (
                os.fdopen(raw_fd, "wb") as raw,
                tqdm(
                    total=total_bytes,
                    unit="B",
                    unit_scale=True,
                    unit_divisor=1024,
                    desc=f"encode {out_path.name}",
                    disable=not show_progress,
                ) as bar,
            ):
                n_tokens = 0
                for batch in _batches(_document_chunks(paths), batch_bytes):
                    n_tokens += self._write_batch(batch, raw, dtype, eot, bar)
            _wrap_as_npy(raw_name, npy_name, dtype, n_tokens)
            os.replace(npy_name, out_path)
        finally:
            for leftover in (raw_name, npy_name):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(leftover)
        return out_path

    def _write_batch(self, batch: list[_Chunk], raw, dtype: np.dtype, eot: np.ndarray | None, bar: tqdm) -> int:
        """Encode one batch of chunks in parallel and append their tokens to ``raw``, ``eot`` (if any) after each
        document's last chunk; returns how many tokens were written."""
        n_tokens = 0
        encodings = self._tok.encode_batch_fast([t for t, _, _ in batch], add_special_tokens=False)
        for enc, (_, nbytes, last) in zip(encodings, batch, strict=True):
            ids = np.array(enc.ids, dtype=dtype)
            raw.write(ids.tobytes())
            n_tokens += len(ids)
            if last and eot is not None:
                raw.write(eot.tobytes())
                n_tokens += 1
            bar.update(nbytes)
        return n_tokens


def _document_chunks(paths: list[Path]) -> Iterator[_Chunk]:
    """Every file's chunks in order, each marked whether it ends its file's document (and so gets the EOT)."""
    for path in paths:
        chunks = _iter_file_chunks(path)
        prev = next(chunks, None)
        if prev is None:  # empty file: still one (empty) document
            yield ("", 0, True)
        # Look one chunk ahead so the last chunk of each file is known (it gets the EOT).
        while prev is not None:
            nxt = next(chunks, None)
            yield (prev[0], prev[1], nxt is None)
            prev = nxt


def _batches(chunks: Iterable[_Chunk], batch_bytes: int) -> Iterator[list[_Chunk]]:
    """Chunks grouped for one batched encode each: a batch ends once it holds ``batch_bytes`` of text."""
    pending: list[_Chunk] = []
    pending_bytes = 0
    for chunk in chunks:
        pending.append(chunk)
        pending_bytes += chunk[1]
        if pending_bytes >= batch_bytes:
            yield pending
            pending, pending_bytes = [], 0
    if pending:
        yield pending


def _wrap_as_npy(raw_name: str, npy_name: str, dtype: np.dtype, n_tokens: int) -> None:
    """Write the raw token stream as ``.npy``: the header needs the final length, known only once every batch
    is written. A plain sequential copy, cheap next to encoding (about a second per GB)."""
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": (n_tokens,)}
    with open(npy_name, "wb") as dst, open(raw_name, "rb") as src:
        np.lib.format.write_array_header_1_0(dst, header)
        shutil.copyfileobj(src, dst, 16 << 20)


def _training_texts(paths: list[Path]) -> Iterator[str]:
    """Text pieces for BPE training, with ``<|endoftext|>`` separators removed.

    Splitting on the separator (as the course's reference does) keeps merges from spanning two
    documents and keeps the separator's characters from being learned as ordinary merges.
    """
    for path in paths:
        for text, _ in _iter_file_chunks(path):
            for piece in text.split(END_OF_TEXT):
                if piece:
                    yield piece
