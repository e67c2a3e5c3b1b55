import json
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from cs336_basics.data import tokenizer as tokmod
from cs336_basics.data.tokenizer import END_OF_TEXT, BPETokenizer
from cs336_basics.errors import ConfigError
from cs336_basics.files.atomic import TEMP_PREFIX

STDLIB = Path(sysconfig.get_paths()["stdlib"])
# A few real source files (~150 KB): enough for hundreds of merges, fast to train on.
CORPUS_FILES = [STDLIB / name for name in ("textwrap.py", "string.py", "bisect.py", "heapq.py", "shlex.py")]
SHAKESPEARE = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "tinyshakespeare.txt"

ROUND_TRIP = [
    "",
    "hello world",
    "Hello, World! It's 2024; we're testing.",
    "héllo wörld, naïve café, Ελληνικά, 日本語のテキスト",
    "emoji 🎉👍🏽 family 👨‍👩‍👧 flags 🇫🇷",
    "   leading and trailing   ",
    "tabs\tand\n\nnewlines\r\n\r\n  \n\t\t",
    "def f(x):\n    if x:\n        return {'a': [1, 2, 3]}  # comment\n",
    "zero-width\u200bjoiner and \x00 nul and \x7f",
]


@pytest.fixture(scope="module")
def tok() -> BPETokenizer:
    return BPETokenizer.train(CORPUS_FILES, 600, show_progress=False)


def test_vocab_size_exact_and_eot(tok):
    assert tok.vocab_size == 600
    assert tok.encode(END_OF_TEXT) == [tok.eot_id]
    # Every byte is in the vocabulary, so any text encodes without unknown tokens.
    assert len(set(tok.hf_tokenizer.get_vocab())) == 600


def test_small_corpus_reports_real_vocab_size(tmp_path):
    path = tmp_path / "tiny.txt"
    path.write_text("ab ab ab abc\n")
    tok = BPETokenizer.train([path], 5000, show_progress=False)
    assert 257 <= tok.vocab_size < 5000
    assert tok.decode(tok.encode("ab abc")) == "ab abc"


def test_vocab_too_small_is_config_error(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("abc")
    with pytest.raises(ConfigError, match="at least 257"):
        BPETokenizer.train([path], 100, show_progress=False)


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_round_trip(tok, text):
    assert tok.decode(tok.encode(text)) == text


def test_merges_compress(tok):
    text = CORPUS_FILES[0].read_text()
    assert len(tok.encode(text)) < len(text.encode()) / 2


def test_eot_is_never_split(tok):
    text = f"first doc.{END_OF_TEXT}second doc{END_OF_TEXT}{END_OF_TEXT}"
    ids = tok.encode(text)
    assert ids.count(tok.eot_id) == 3
    assert ids == tok.encode("first doc.") + [tok.eot_id] + tok.encode("second doc") + [tok.eot_id] * 2
    assert tok.decode(ids) == text
    # Its pieces alone are ordinary text, not the special token.
    assert tok.eot_id not in tok.encode("<|endof text|>")


def test_save_load_identical(tok, tmp_path):
    tok.save(tmp_path / "tok")
    for name in ("tokenizer.json", "vocab.json", "merges.txt"):
        assert (tmp_path / "tok" / name).is_file()
    assert not [p for p in (tmp_path / "tok").iterdir() if p.name.startswith(TEMP_PREFIX)]
    vocab = json.loads((tmp_path / "tok" / "vocab.json").read_text())
    assert len(vocab) == tok.vocab_size and vocab[END_OF_TEXT] == tok.eot_id
    merges = (tmp_path / "tok" / "merges.txt").read_text().splitlines()
    assert merges[0].startswith("#version")
    # 256 bytes + <|endoftext|> + one token per merge.
    assert len(merges) - 1 == tok.vocab_size - 257

    loaded = BPETokenizer.load(tmp_path / "tok")
    assert loaded.vocab_size == tok.vocab_size and loaded.eot_id == tok.eot_id
    for text in ROUND_TRIP + [CORPUS_FILES[1].read_text()]:
        assert loaded.encode(text) == tok.encode(text)


def test_load_errors(tmp_path):
    with pytest.raises(ConfigError, match="No tokenizer found"):
        BPETokenizer.load(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ConfigError, match="Cannot read tokenizer"):
        BPETokenizer.load(tmp_path)


def test_train_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        BPETokenizer.train([tmp_path / "nope.txt"], 300, show_progress=False)


def _expected(tok, paths):
    ids = []
    for p in paths:
        ids += tok.encode(p.read_bytes().decode("utf-8", errors="replace")) + [tok.eot_id]
    return ids


def test_encode_files_matches_per_file_encode(tok, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    unicode = tmp_path / "unicode.txt"
    unicode.write_text("naïve 🎉\n" * 10 + END_OF_TEXT + "\nafter\n")
    files = [*CORPUS_FILES[:3], empty, unicode]
    out = tok.encode_files(files, tmp_path / "out" / "tokens.npy", show_progress=False)
    arr = np.load(out)
    assert arr.dtype == np.uint16
    assert arr.tolist() == _expected(tok, files)
    assert [p.name for p in out.parent.iterdir()] == ["tokens.npy"]  # no temp files left behind

    no_eot = tok.encode_files(files[:1], tmp_path / "no_eot.npy", append_eot=False, show_progress=False)
    assert np.load(no_eot).tolist() == tok.encode(files[0].read_text())


def test_encode_files_chunked_is_exact(tok, tmp_path, monkeypatch):
    # Tiny chunks and batches: one file becomes many chunks across several batched encodes.
    monkeypatch.setattr(tokmod, "_CHUNK_BYTES", 512)
    monkeypatch.setattr(tokmod, "_MIN_BATCH_BYTES", 4096)
    monkeypatch.setattr(tokmod, "_CHUNKS_PER_CORE", 1)
    out = tok.encode_files(CORPUS_FILES, tmp_path / "chunked.npy", show_progress=False)
    assert np.load(out).tolist() == _expected(tok, CORPUS_FILES)


def test_chunker_fallback_without_safe_boundaries(tmp_path):
    # No plain-character line breaks at all: the chunker must still cut (bounded memory) and lose nothing.
    path = tmp_path / "crlf.txt"
    text = "é word, 🎉 " * 2000 + "\r\n".join(["  indented é"] * 500)
    path.write_bytes(text.encode())
    chunks = list(tokmod._iter_file_chunks(path, chunk_bytes=256))
    assert len(chunks) > 10
    assert "".join(c for c, _ in chunks) == text
    assert sum(n for _, n in chunks) == len(text.encode())
    assert max(n for _, n in chunks) <= (tokmod._MAX_CARRY_CHUNKS + 1) * 256


def test_encode_files_invalid_utf8(tok, tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"valid \xff\xfe invalid\n")
    arr = np.load(tok.encode_files([path], tmp_path / "bad.npy", show_progress=False))
    assert tok.decode(arr.tolist()) == "valid \ufffd\ufffd invalid\n" + END_OF_TEXT


def test_encode_files_missing_input(tok, tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        tok.encode_files([tmp_path / "missing.txt"], tmp_path / "x.npy", show_progress=False)
    assert not (tmp_path / "x.npy").exists()


def test_tinyshakespeare_chunked_encode(tmp_path, monkeypatch):
    if not SHAKESPEARE.is_file():
        pytest.skip(f"{SHAKESPEARE} not present")
    tok = BPETokenizer.train([SHAKESPEARE], 1000, show_progress=False)
    assert tok.vocab_size == 1000
    monkeypatch.setattr(tokmod, "_CHUNK_BYTES", 64 << 10)
    arr = np.load(tok.encode_files([SHAKESPEARE], tmp_path / "shakespeare.npy", show_progress=False))
    text = SHAKESPEARE.read_text()
    assert arr.tolist() == tok.encode(text) + [tok.eot_id]
    assert tok.decode(arr[:-1].tolist()) == text
