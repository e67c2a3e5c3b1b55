"""The course's BPE trainer and Tokenizer, against references written here and HF `tokenizers` (an
independent byte-level BPE with GPT-2's pre-tokenizer) on real text."""

import itertools
import json
import os
import random
import subprocess
import sys
import sysconfig
import tracemalloc
from collections import Counter
from pathlib import Path

import pytest
import regex

from cs336_basics import Tokenizer, train_bpe
from cs336_basics.data import bpe, bpe_tokenizer
from cs336_basics.data.tokenizer import BPETokenizer

EOT = "<|endoftext|>"
STDLIB = Path(sysconfig.get_paths()["stdlib"])
REAL_FILES = [STDLIB / name for name in ("textwrap.py", "string.py", "bisect.py", "heapq.py", "shlex.py")]
SHAKESPEARE = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "tinyshakespeare.txt"
# GPT-2's pre-tokenizer, written out here rather than imported, so the references below are independent.
GPT2_SPLIT = regex.compile(r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")

SAMPLES = [
    "",
    "hello world",
    "Hello, World! It's 2024; we're testing... they'll've",
    "héllo wörld, naïve café, Ελληνικά, 日本語のテキスト, العربية",
    "emoji 🎉👍🏽 family 👨‍👩‍👧 flags 🇫🇷",
    "   leading and trailing   ",
    "tabs\tand\n\nnewlines\r\n\r\n  \n\t\t end  \n",
    "def f(x):\n    if x:\n        return {'a': [1, 2, 3]}  # comment\n",
    "zero-width\u200bjoiner, \x00 nul, \x7f del, \u3000 ideographic space",
]


def real_text(limit: int = 60_000) -> str:
    """The first ``limit`` characters of the standard library's sources (REAL_FILES first)."""
    parts, size = [], 0
    for path in itertools.chain(REAL_FILES, sorted(STDLIB.glob("[a-z]*.py"))):
        if size >= limit:
            break
        parts.append(path.read_text(encoding="utf-8", errors="replace"))
        size += len(parts[-1])
    return "".join(parts)[:limit]


# --- references ------------------------------------------------------------------------------------------


def naive_train(text: str, vocab_size: int, specials: list[str]):
    """BPE training straight from the definition: recount every pair after every merge, bytes throughout."""
    vocab = {i: s.encode() for i, s in enumerate(specials)} | {len(specials) + b: bytes([b]) for b in range(256)}
    pattern = "|".join(map(regex.escape, sorted(specials, key=len, reverse=True)))
    pieces = regex.split(pattern, text) if specials else [text]
    words = Counter(tuple(bytes([c]) for c in t.encode()) for p in pieces for t in GPT2_SPLIT.findall(p))
    merges = []
    while len(vocab) < vocab_size:
        pairs = Counter()
        for word, n in words.items():
            for pair in zip(word, word[1:], strict=False):
                pairs[pair] += n
        if not pairs:
            break
        best = max(pairs, key=lambda p: (pairs[p], p))
        merges.append(best)
        vocab[len(vocab)] = best[0] + best[1]
        merged = Counter()
        for word, n in words.items():
            out, i = [], 0
            while i < len(word):
                if word[i : i + 2] == best:
                    out.append(best[0] + best[1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += n
        words = merged
    return vocab, merges


def naive_encode(text: str, vocab: dict[int, bytes], merges, specials: list[str]) -> list[int]:
    """Split out specials, pre-tokenize, then apply each merge in learned order to every pre-token."""
    ids = {b: i for i, b in sorted(vocab.items(), reverse=True)}
    out = []
    pattern = "(" + "|".join(map(regex.escape, sorted(specials, key=len, reverse=True))) + ")"
    for piece in regex.split(pattern, text) if specials else [text]:
        if piece in specials:
            out.append(ids[piece.encode()])
            continue
        for token in GPT2_SPLIT.findall(piece):
            parts = [bytes([c]) for c in token.encode()]
            for a, b in merges:
                i, merged = 0, []
                while i < len(parts):
                    if i + 1 < len(parts) and parts[i] == a and parts[i + 1] == b:
                        merged.append(a + b)
                        i += 2
                    else:
                        merged.append(parts[i])
                        i += 1
                parts = merged
            out.extend(ids[p] for p in parts)
    return out


# --- BPE training ----------------------------------------------------------------------------------------


def test_train_bpe_hand_worked_ties(tmp_path):
    """Pre-tokens abab, abq, zq (the special token keeps them apart and is not counted).

    1. pairs: ab 3, ba 1, bq 1, zq 1           -> merge (a, b)
    2. [ab ab] [ab q] [z q]: ab|ab, ab|q, z|q all 1 -> the greatest as bytes: (z, q)  (b"z" > b"ab")
    3. [ab ab] [ab q] [zq]: ab|ab 1, ab|q 1         -> (ab, q)  (b"q" > b"ab")
    4. [ab ab] [abq] [zq]: ab|ab 1                  -> (ab, ab)
    Comparing token ids instead of bytes would pick (ab, ab) at step 2, since ab's id (257) is above z's.
    Without the split on the special token, its pieces (endoftext twice) would win the ties instead.
    """
    path = tmp_path / "ties.txt"
    path.write_text(f"abab{EOT}abq{EOT}zq")
    vocab, merges = train_bpe(path, 1 + 256 + 4, [EOT])
    assert merges == [(b"a", b"b"), (b"z", b"q"), (b"ab", b"q"), (b"ab", b"ab")]
    assert vocab[0] == EOT.encode() and all(vocab[1 + b] == bytes([b]) for b in range(256))
    assert [vocab[i] for i in range(257, 261)] == [b"ab", b"zq", b"abq", b"abab"]
    assert (vocab, merges) == naive_train(path.read_text(), 261, [EOT])


def test_train_bpe_matches_definition_on_real_text(tmp_path):
    text = real_text(25_000).replace("\n\n\n", f"\n{EOT}\n")
    path = tmp_path / "real.txt"
    path.write_text(text, encoding="utf-8")
    assert train_bpe(path, 420, [EOT]) == naive_train(text, 420, [EOT])


def test_parallel_chunks_count_exactly_what_one_pass_counts(tmp_path, monkeypatch):
    # Chunks of ~2 KB: dozens of cuts, at special tokens (one of them containing spaces) and safe spaces.
    specials = [EOT, "<| sep |>"]
    text = real_text(120_000)
    text = text.replace("\n\n\n", f"\n{EOT}\n").replace("return ", "return <| sep |> ")
    path = tmp_path / "t.txt"
    path.write_text(text, encoding="utf-8")
    monkeypatch.setattr(bpe, "_MIN_CHUNK_BYTES", 2048)
    monkeypatch.setattr(bpe, "_SEARCH_BYTES", 512)
    bounds = bpe._chunk_bounds(path, 50, specials)
    assert len(bounds) > 40
    whole = Counter()
    for piece in regex.split("|".join(map(regex.escape, specials)), text):
        whole.update(GPT2_SPLIT.findall(piece))
    for kept in (specials, []):
        counted = bpe.pretoken_counts(path, kept, num_processes=2)
        expected = whole if kept else Counter(GPT2_SPLIT.findall(text))
        assert counted == expected
    assert train_bpe(path, 300, specials, num_processes=2) == train_bpe(path, 300, specials, num_processes=1)


def test_chunks_never_cut_inside_a_special_token(tmp_path, monkeypatch):
    # The only spaces are inside the special token, so most places that look safe are inside one.
    special = "<| sep |>"
    text = "".join(f"w{i % 13}{special}" for i in range(3000))
    path = tmp_path / "t.txt"
    path.write_text(text)
    monkeypatch.setattr(bpe, "_SEARCH_BYTES", 64)
    monkeypatch.setattr(bpe, "_MIN_CHUNK_BYTES", 512)
    bounds = bpe._chunk_bounds(path, 40, [special])
    assert len(bounds) > 30
    assert all(text[b:].startswith(special) for b in bounds[1:-1])
    expected = Counter(t for piece in text.split(special) for t in GPT2_SPLIT.findall(piece))
    assert bpe.pretoken_counts(path, [special], num_processes=2) == expected


def test_train_bpe_errors_and_small_corpus(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("ab ab")
    with pytest.raises(ValueError, match="at least 257"):
        train_bpe(path, 256, [EOT])
    with pytest.warns(UserWarning, match="ran out of pairs"):
        vocab, merges = train_bpe(path, 1000, [EOT])
    assert merges == [(b"a", b"b"), (b" ", b"ab")] and len(vocab) == 259
    with pytest.raises(FileNotFoundError):
        train_bpe(tmp_path / "missing.txt", 300, [])
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok \xff\xfe bytes")
    with pytest.raises(ValueError, match="UTF-8"):
        train_bpe(bad, 300, [])


# --- Tokenizer -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    path = tmp_path_factory.mktemp("bpe") / "train.txt"
    path.write_text(real_text(), encoding="utf-8")
    vocab, merges = train_bpe(path, 700, [EOT])
    return vocab, merges


@pytest.fixture(scope="module")
def tok(trained) -> Tokenizer:
    return Tokenizer(*trained, special_tokens=[EOT])


@pytest.mark.parametrize("text", SAMPLES)
def test_round_trip(tok, text):
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert ids == naive_encode(text, tok.vocab, tok.merges, [EOT])


def test_encode_matches_definition_on_real_text(tok, trained):
    text = "".join(p.read_text(encoding="utf-8") for p in REAL_FILES[:3])[-20_000:]
    ids = tok.encode(text)
    assert ids == naive_encode(text, *trained, [EOT])
    assert len(ids) < len(text.encode()) / 2.5  # the merges compress
    assert all(isinstance(i, int) for i in ids)


def test_special_tokens_never_split_longest_first(trained):
    double = EOT + EOT
    tok = Tokenizer(*trained, special_tokens=[EOT, double, "<pad>"])
    eot, dbl, pad = tok.encode(EOT), tok.encode(double), tok.encode("<pad>")
    assert len(eot) == len(dbl) == len(pad) == 1 and len({eot[0], dbl[0], pad[0]}) == 3
    assert eot[0] == 0 and tok.vocab[dbl[0]] == double.encode()  # added after the largest id
    text = f"a{EOT * 3}b<pad><pad> {EOT} c{EOT}"
    ids = tok.encode(text)
    b, space, c = tok.encode("b"), tok.encode(" "), tok.encode(" c")
    assert ids == tok.encode("a") + dbl + eot + b + pad + pad + space + eot + c + eot
    assert tok.decode(ids) == text
    assert ids == naive_encode(text, tok.vocab, tok.merges, [EOT, double, "<pad>"])
    # Without special tokens the same characters are ordinary text, and pieces of one never match.
    plain = Tokenizer(*trained)
    assert len(plain.encode(EOT)) > 1 and plain.decode(plain.encode(text)) == text
    assert eot[0] not in tok.encode("<|endoftext|"[:-1] + " |>")


def test_decode_replaces_invalid_utf8(tok):
    byte_id = {b: i for i, b in tok.vocab.items()}
    assert tok.decode([byte_id[b"\xff"]]) == "\ufffd"
    e_acute = tok.encode("é")
    assert tok.decode([byte_id[b"h"], byte_id["é".encode()[:1]], byte_id[b"i"]]) == "h\ufffdi"
    assert tok.decode(e_acute) == "é"
    with pytest.raises(ValueError, match="not in the vocabulary"):
        tok.decode([10**6])


def test_bad_vocabularies_are_errors(trained):
    vocab, merges = trained
    with pytest.raises(ValueError, match="not in the vocabulary"):
        Tokenizer(vocab, [*merges, (b"zz", b"qq")])
    no_tilde = {i: b for i, b in vocab.items() if b != b"~"}
    tok = Tokenizer(no_tilde, [m for m in merges if b"~" not in m[0] + m[1]])
    with pytest.raises(ValueError, match="0x7e"):
        tok.encode("a~b")


def test_duplicate_token_bytes_encode_as_the_smallest_id(trained):
    vocab, merges = trained
    tok = Tokenizer({**vocab, 5000: vocab[300]}, merges)
    assert 5000 not in tok.encode(real_text(5000)) and tok.decode([5000]) == vocab[300].decode(errors="replace")


# --- encode_iterable -------------------------------------------------------------------------------------


def chunked(text: str, rng: random.Random, longest: int):
    i = 0
    while i < len(text):
        n = rng.randint(1, longest)
        yield text[i : i + n]
        i += n


def test_encode_iterable_equals_encode_however_the_text_is_cut(trained, monkeypatch):
    # A small stream buffer makes every chunk boundary a potential cut point.
    monkeypatch.setattr(bpe_tokenizer, "_STREAM_CHARS", 24)
    double = EOT + EOT
    tok = Tokenizer(*trained, special_tokens=[EOT, double])
    text = "".join(SAMPLES) + EOT + real_text(4000) + EOT * 3 + "日本語 they'll  \n\n  x" + EOT + "   "
    expected = tok.encode(text)
    rng = random.Random(0)
    for longest in (1, 2, 3, 7, 40, 500):
        assert list(tok.encode_iterable(chunked(text, rng, longest))) == expected, longest
    assert list(tok.encode_iterable(text.splitlines(keepends=True))) == expected
    assert list(tok.encode_iterable([])) == [] and list(tok.encode_iterable(["", ""])) == []
    with pytest.raises(TypeError, match="strings"):
        list(tok.encode_iterable([b"bytes"]))


@pytest.mark.parametrize(
    "chunks",
    [
        # A whitespace run, then an unfinished special token: "  " stays one pre-token before the special.
        ["x" * 30 + "  <|endoftext|", ">tail"],
        ["x" * 30 + "  <|endof", "text|> tail"],
        # A contraction cut after its first letter, and whitespace runs cut in the middle.
        ["y" * 30 + " they'l", "l go"],
        ["z" * 30 + " a \n\n  ", "  \n b"],
    ],
)
def test_encode_iterable_at_the_edges_of_a_cut(tok, monkeypatch, chunks):
    monkeypatch.setattr(bpe_tokenizer, "_STREAM_CHARS", 24)
    assert list(tok.encode_iterable(chunks)) == tok.encode("".join(chunks))


def test_encode_iterable_reads_a_file_lazily(tok, tmp_path):
    path = tmp_path / "t.txt"
    text = real_text(300_000)
    path.write_text(text, encoding="utf-8")
    read = 0
    with open(path, encoding="utf-8") as f:

        def lines():
            nonlocal read
            for line in f:
                read += len(line)
                yield line

        stream = tok.encode_iterable(lines())
        first = next(stream)
        assert read < len(text) / 2  # the first id needed only the start of the file
        ids = [first, *stream]
    assert read == len(text) and ids == tok.encode(text)


def test_encode_iterable_memory_stays_flat(tok):
    """Peak Python memory while streaming 0.5 MB and 2 MB of text (warm cache) is the same, and small."""
    lines = real_text(250_000).splitlines(keepends=True)
    tok.encode("".join(lines))  # fill the pre-token cache outside the measurement

    def peak(copies: int) -> int:
        tracemalloc.start()
        try:
            n = sum(1 for _ in tok.encode_iterable(itertools.chain.from_iterable(itertools.repeat(lines, copies))))
            assert n > 0
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    small, large = peak(2), peak(8)
    assert large < 1.2 * small + 50_000
    assert large < 1_500_000  # the 2 MB input is never held at once (nor its ~600K ids)


# --- GPT-2 file format and HF tokenizers as the reference --------------------------------------------


def test_save_and_from_files_round_trip(tok, tmp_path):
    tok.save(tmp_path / "vocab.json", tmp_path / "merges.txt")
    lines = (tmp_path / "merges.txt").read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("#version") and len(lines) == len(tok.merges) + 1
    assert json.loads((tmp_path / "vocab.json").read_text(encoding="utf-8"))["Ġ"] == tok.encode(" ")[0]
    loaded = Tokenizer.from_files(tmp_path / "vocab.json", tmp_path / "merges.txt", special_tokens=[EOT])
    assert loaded.vocab == tok.vocab and loaded.merges == tok.merges
    text = "".join(SAMPLES) + EOT + real_text(3000)
    assert loaded.encode(text) == tok.encode(text)


@pytest.fixture(scope="module")
def hf_tokenizer(tmp_path_factory) -> tuple[BPETokenizer, Path]:
    folder = tmp_path_factory.mktemp("hf")
    hf = BPETokenizer.train(REAL_FILES, 1200, show_progress=False)
    hf.save(folder)
    return hf, folder


def hf_reference_texts() -> list[str]:
    texts = [*SAMPLES, real_text(200_000), f"{EOT}two docs{EOT}{EOT}"]
    texts += [p.read_text(encoding="utf-8") for p in sorted((STDLIB / "email").glob("*.py"))[:10]]
    if SHAKESPEARE.is_file():
        texts.append(SHAKESPEARE.read_text(encoding="utf-8")[:200_000])
    return texts


def test_encodes_like_hf_tokenizers_with_the_same_vocab_and_merges(hf_tokenizer):
    """HF's byte-level BPE (GPT-2 pre-tokenizer, Rust) exported as vocab.json + merges.txt: our Tokenizer,
    given those files, must produce HF's ids exactly."""
    hf, folder = hf_tokenizer
    tok = Tokenizer.from_files(folder / "vocab.json", folder / "merges.txt", special_tokens=[EOT])
    assert len(tok.vocab) == hf.vocab_size
    for text in hf_reference_texts():
        assert tok.encode(text) == hf.encode(text)
        assert tok.decode(tok.encode(text)) == text


GPT2_DIR = os.environ.get("CS336_GPT2_DIR")


@pytest.mark.skipif(not GPT2_DIR, reason="set CS336_GPT2_DIR to a folder with GPT-2's encoder.json and vocab.bpe")
def test_gpt2_vocabulary_encodes_like_hf_tokenizers():
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers

    vocab_path, merges_path = Path(GPT2_DIR) / "encoder.json", Path(GPT2_DIR) / "vocab.bpe"
    tok = Tokenizer.from_files(vocab_path, merges_path, special_tokens=[EOT])
    assert len(tok.vocab) == 50257 and tok.encode(EOT) == [50256]
    hf = HFTokenizer(models.BPE.from_file(str(vocab_path), str(merges_path)))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.add_special_tokens([EOT])
    for text in hf_reference_texts():
        assert tok.encode(text) == hf.encode(text, add_special_tokens=False).ids


def test_the_course_tokenizer_imports_without_torch():
    script = "import sys; from cs336_basics import Tokenizer, train_bpe; print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stderr
