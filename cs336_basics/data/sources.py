"""Where training tokens come from: built-in corpora, the user's text, or ready-made token arrays.

Everything expensive (BPE training, encoding) is cached under one folder, keyed by what it was built from,
so the second run with the same inputs starts in well under a second. What the cache holds is checked when it is
read, like any token file (complete, ids within the tokenizer's vocabulary), and a damaged entry is built again.
"""

from __future__ import annotations

import codecs
import errno
import filecmp
import hashlib
import json
import math
import os
import shutil
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cs336_basics.config import DataConfig
from cs336_basics.data.batching import load_token_array
from cs336_basics.data.tokenizer import BPETokenizer, check_bpe_vocab
from cs336_basics.errors import ConfigError, os_reason
from cs336_basics.files.atomic import remove_stale_temps, temp_prefix

# Bump when the cached files' format or the way they are built changes: old entries are then ignored.
CACHE_VERSION = 1
# Every VAL_EVERY-th standard-library file (in sorted order) is validation: a file-level split, so no
# source file contributes to both sides.
VAL_EVERY = 20
# Share of the train tokens held out for validation when no validation data is given.
HOLDOUT_FRACTION = 0.05

TINYSTORIES_REPO = "roneneldan/TinyStories"
TINYSTORIES_FILES = ("TinyStoriesV2-GPT4-train.txt", "TinyStoriesV2-GPT4-valid.txt")

_TEXT_SUFFIXES = (".txt",)
_TOKEN_SUFFIXES = (".npy", ".bin")


def default_cache_dir() -> Path:
    """``$CS336_CACHE_DIR``, or ``~/.cache/cs336_basics``."""
    env = os.environ.get("CS336_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "cs336_basics"


def stdlib_source_files() -> list[Path]:
    """The running interpreter's standard-library ``*.py`` files (third-party packages excluded), sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    # Third-party packages live inside the stdlib folder on most installs and can outnumber it many
    # times over: prune them during the walk rather than filtering afterwards.
    excluded = {"site-packages", "dist-packages", "__pycache__"}
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in excluded]
        files.extend(Path(dirpath, f) for f in filenames if f.endswith(".py"))
    files = [p for p in files if p.is_file()]  # drops dangling symlinks
    if not files:
        raise ConfigError(
            f"Found no standard-library sources under {root} (a stripped Python install?); "
            "use --dataset tinystories or pass your own --train_data."
        )
    # Sorted by relative path so the split and the cache key are the same on every machine and run.
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


@dataclass
class PreparedData:
    train: np.ndarray
    val: np.ndarray
    # None when the data came as token arrays: there is no tokenizer to decode with.
    tokenizer: BPETokenizer | None
    # One line for the run's config summary.
    description: str


def _log(msg: str) -> None:
    # stderr, like the progress bars, so stdout stays clean for whatever the caller prints.
    print(f"[data] {msg}", file=sys.stderr, flush=True)


def _key(payload: Any) -> str:
    blob = json.dumps({"version": CACHE_VERSION, "payload": payload}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _file_identity(path: Path) -> list[Any]:
    # Its stat instead of a content hash: hashing a multi-GB corpus on every start would cost more than the cache
    # saves. An edited file gets a new mtime; a file whose mtime was set back (cp -p, rsync -a, tar x, touch -d)
    # still gets a new ctime, which no tool sets.
    st = path.stat()
    return [str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _count(n: int) -> str:
    if n >= 1_000_000:
        return f"{n / 1e6:.1f}M"
    if n >= 1_000:
        return f"{n / 1e3:.1f}K"
    return str(n)


def _megabytes(nbytes: int) -> str:
    return f"{nbytes / 1e6:.1f} MB"


def _ensure_cache(cache: Path) -> None:
    try:
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=cache):
            pass
    except OSError as exc:
        raise ConfigError(
            f"Cannot write to the data cache {cache} ({os_reason(exc)}); point it somewhere writable with "
            "--cache_dir or $CS336_CACHE_DIR."
        ) from exc
    # A run killed while building an entry (training its tokenizer, encoding) left its temporaries there, and only
    # there: the cache's top level may be a folder of the user's (--cache_dir).
    for entry in [*cache.glob("stdlib-*"), *cache.glob("text-*")]:
        if entry.is_dir():
            remove_stale_temps(entry)


def _discard(path: Path, problem: str) -> None:
    """Remove a damaged cache entry, so that it is built again; a ConfigError if it cannot be removed."""
    _log(f"{path} in the data cache cannot be used ({problem}); building it again")
    try:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    except OSError as exc:
        raise ConfigError(
            f"{path} in the data cache cannot be used ({problem}) nor removed ({os_reason(exc)}); delete it, or point "
            "--cache_dir (or $CS336_CACHE_DIR) at another folder."
        ) from exc


def _problem(exc: ConfigError, path: Path) -> str:
    """What a reader's error says is wrong, without its path (said already) and its advice (for the user's files)."""
    return str(exc).split("; ")[0].replace(f" {path}", "")


def _cached_tokenizer(directory: Path, files: list[Path], vocab_size: int, what: str) -> BPETokenizer:
    """Load the tokenizer cached in ``directory``, or train it on ``files`` and cache it there."""
    if (directory / "tokenizer.json").is_file():
        try:
            return BPETokenizer.load(directory)
        except ConfigError as exc:  # the encodings beside it came from it: the whole entry is built again
            _discard(directory.parent, _problem(exc, directory / "tokenizer.json"))
    _log(f"training a BPE tokenizer (vocab {vocab_size:,}) on {what} ...")
    start = time.perf_counter()
    tok = BPETokenizer.train(files, vocab_size)
    _log(f"trained BPE (vocab {tok.vocab_size:,}) in {time.perf_counter() - start:.1f} s")
    # Save to a private folder and rename it into place, so concurrent runs never see half a tokenizer.
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=directory.parent, prefix=temp_prefix(directory.name)))
    try:
        tok.save(tmp)
        if directory.is_dir() and not (directory / "tokenizer.json").is_file():
            shutil.rmtree(directory)  # debris from an interrupted manual copy; ours are renamed in whole
        try:
            os.replace(tmp, directory)
        except OSError:
            # Another run cached the same tokenizer first: keep theirs, so encodings stay consistent.
            if not (directory / "tokenizer.json").is_file():
                raise
            return BPETokenizer.load(directory)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return tok


def _cached_encoding(tok: BPETokenizer, files: list[Path], out: Path, what: str) -> np.ndarray:
    """The encoding of ``files`` cached at ``out``, checked as any token file is (a file cut short by a killed writer
    or a full disk, ids from another tokenizer), or encoded (again) and cached there."""
    if out.is_file():
        try:
            return load_token_array(out, tok.vocab_size)
        except ConfigError as exc:
            _discard(out, _problem(exc, out))
    _log(f"encoding {what} ...")
    start = time.perf_counter()
    tok.encode_files(files, out)
    _log(f"encoded {what} in {time.perf_counter() - start:.1f} s")
    return load_token_array(out, tok.vocab_size)


def _require_utf8(path: Path) -> None:
    """A ConfigError unless the text file at `path` is UTF-8 (read in blocks: any size). The tokenizer would read other
    bytes as replacement characters and train on those."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            try:
                decoder.decode(block)
            except UnicodeDecodeError as exc:
                utf16 = offset == 0 and block[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)
                raise ConfigError(
                    f"{path} is not UTF-8 text: near byte {offset + exc.start:,} ({exc.reason})"
                    + (", and it starts with UTF-16's byte-order mark" if utf16 else "")
                    + f". Convert it, e.g. iconv -f {'UTF-16' if utf16 else 'LATIN1'} -t UTF-8 (naming its encoding), "
                    "or pass token arrays (.npy)."
                ) from exc
            offset += len(block)


def _with_val(
    train: np.ndarray, train_path: Path, val_path: Path | None, read_val: Callable[[Path], np.ndarray]
) -> tuple[np.ndarray, np.ndarray, str]:
    """(train, val, a note on where val came from): `read_val(val_path)`, or the last HOLDOUT_FRACTION of train."""
    if val_path is None:
        return *_hold_out(train, train_path), f"last {HOLDOUT_FRACTION:.0%} of train held out as val"
    note = f"val from {val_path.name}"
    if _same_content(train_path, val_path):
        note += ", the training data itself: its loss measures fitting, not generalisation"
    return train, read_val(val_path), note


def _same_content(a: Path, b: Path) -> bool:
    """Whether two files hold the same bytes (compared only where their sizes agree)."""
    return a.stat().st_size == b.stat().st_size and filecmp.cmp(a, b, shallow=False)


def _hold_out(tokens: np.ndarray, source: Path) -> tuple[np.ndarray, np.ndarray]:
    """Split off the last HOLDOUT_FRACTION of the tokens as validation (views: no copy)."""
    n_val = max(1, math.ceil(len(tokens) * HOLDOUT_FRACTION))
    if len(tokens) - n_val < 1:
        raise ConfigError(
            f"{source} has only {len(tokens)} tokens, too few to hold out validation data; "
            "pass --val_data or use more data."
        )
    return tokens[:-n_val], tokens[-n_val:]


def _prepare_stdlib(cache: Path, vocab_size: int) -> PreparedData:
    _ensure_cache(cache)
    root = Path(sysconfig.get_paths()["stdlib"])
    files = stdlib_source_files()
    sizes = [p.stat().st_size for p in files]
    key = _key(
        {
            "kind": "stdlib",
            "vocab_size": vocab_size,
            "val_every": VAL_EVERY,
            "files": [[p.relative_to(root).as_posix(), s] for p, s in zip(files, sizes, strict=True)],
        }
    )
    folder = cache / f"stdlib-{key}"
    val_files = files[VAL_EVERY - 1 :: VAL_EVERY]
    val_set = set(val_files)
    train_files = [p for p in files if p not in val_set]
    what = f"Python stdlib source ({len(files):,} files, {_megabytes(sum(sizes))})"
    # The tokenizer sees only the training files, so validation text is truly unseen.
    tok = _cached_tokenizer(folder / "tokenizer", train_files, vocab_size, what)
    train = _cached_encoding(tok, train_files, folder / "train.npy", f"{len(train_files):,} train files")
    val = _cached_encoding(tok, val_files, folder / "val.npy", f"{len(val_files):,} val files")
    desc = (
        f"{what} -> {_count(len(train))} train / {_count(len(val))} val tokens "
        f"(every {VAL_EVERY}th file is val), BPE vocab {tok.vocab_size:,}, cached in {folder}"
    )
    return PreparedData(train=train, val=val, tokenizer=tok, description=desc)


def _prepare_text(
    train_path: Path,
    val_path: Path | None,
    vocab_size: int,
    cache: Path,
    label: str,
    tokenizer: str | None = None,
    users: bool = True,
) -> PreparedData:
    """Text files tokenised (a BPE trained on the train file, or `tokenizer`) and cached. `users`: the files are the
    user's, held to being UTF-8 (a built-in corpus, like the standard library's test fixtures, may hold stray bytes:
    they become replacement characters)."""
    _ensure_cache(cache)
    size = train_path.stat().st_size
    if tokenizer is not None:  # a given tokenizer (a fine-tune's base run's): the encodings are keyed by it
        tok_path = Path(tokenizer).expanduser()
        tok = BPETokenizer.load(tok_path)
        if tok.vocab_size > vocab_size:
            raise ConfigError(
                f"--tokenizer {tok_path} has {tok.vocab_size:,} tokens but the model's vocabulary is {vocab_size:,}."
            )
        identity = _file_identity(tok_path / "tokenizer.json" if tok_path.is_dir() else tok_path)
        folder = cache / f"text-{_key({'kind': 'text', 'tokenizer': identity, 'train': _file_identity(train_path)})}"
        label += f", tokenizer {tok_path}"
    else:
        # The tokenizer depends only on the training text; each encoded file is keyed by itself as well,
        # so changing only --val_data re-encodes only the validation file.
        key = _key({"kind": "text", "vocab_size": vocab_size, "train": _file_identity(train_path)})
        folder = cache / f"text-{key}"

    def encoding_path(path: Path) -> Path:
        return folder / f"{path.stem}-{_key(_file_identity(path))}.npy"

    for path in filter(None, (train_path, val_path)):
        if users and not encoding_path(path).is_file():  # about to be read whole anyway (the cache holds checked ones)
            _require_utf8(path)
    if tokenizer is None:
        tok = _cached_tokenizer(folder / "tokenizer", [train_path], vocab_size, f"{train_path} ({_megabytes(size)})")

    def encoded(path: Path) -> np.ndarray:
        return _cached_encoding(tok, [path], encoding_path(path), str(path))

    train, val, val_note = _with_val(encoded(train_path), train_path, val_path, encoded)
    desc = (
        f"{label} ({_megabytes(size)}) -> {_count(len(train))} train / {_count(len(val))} val tokens "
        f"({val_note}), BPE vocab {tok.vocab_size:,}, cached in {folder}"
    )
    if tokenizer is None and tok.vocab_size < vocab_size:  # the text has fewer distinct pieces than asked for
        desc += (
            f"; the model's {vocab_size - tok.vocab_size:,} embedding rows above the BPE's are never used "
            f"(--vocab_size {tok.vocab_size} fits this text)"
        )
    return PreparedData(train=train, val=val, tokenizer=tok, description=desc)


def _prepare_arrays(train_path: Path, val_path: Path | None, vocab_size: int) -> PreparedData:
    train, val, val_note = _with_val(
        load_token_array(train_path, vocab_size), train_path, val_path, lambda path: load_token_array(path, vocab_size)
    )
    desc = (
        f"token arrays {train_path.name} -> {_count(len(train))} train / {_count(len(val))} val tokens "
        f"({val_note}), vocab {vocab_size:,}, no tokenizer"
    )
    return PreparedData(train=train, val=val, tokenizer=None, description=desc)


def _download_tinystories() -> tuple[Path, Path]:
    # Imported here: only this dataset needs the hub client, and importing it costs a noticeable moment.
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    # The hub reads HF_HUB_OFFLINE once at import; re-read it so a value set later is still honoured.
    offline = constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}

    def fetch(name: str) -> Path:
        # The copy in the hub's cache first: the files never change, and asking the hub whether they did would wait
        # out its timeouts and retries on a machine without a network before falling back to that copy.
        try:
            return Path(hf_hub_download(TINYSTORIES_REPO, name, repo_type="dataset", local_files_only=True))
        except LocalEntryNotFoundError:
            if offline:
                raise
        return Path(hf_hub_download(TINYSTORIES_REPO, name, repo_type="dataset"))

    try:
        paths = [fetch(name) for name in TINYSTORIES_FILES]
    except Exception as exc:  # the hub raises many error types (network, auth, offline); all mean the same here
        reason = f"{type(exc).__name__}: {exc}"
        if exc.__cause__ is not None:
            reason += f" (caused by {type(exc.__cause__).__name__}: {exc.__cause__})"
        reason = reason.rstrip(". ")
        raise ConfigError(
            f"Downloading TinyStories from the Hugging Face Hub (dataset {TINYSTORIES_REPO}) failed: {reason}. "
            "Connect to the internet and run again (the files are cached after one download; unset "
            "HF_HUB_OFFLINE if it is set), or pass local files with --train_data/--val_data, or use the "
            "offline default --dataset stdlib."
        ) from exc
    return paths[0], paths[1]


def _classify(path: Path, flag: str) -> str:
    """ "text" or "tokens" for a data file that exists; a ConfigError naming the flag otherwise."""
    suffix = path.suffix.lower()
    if suffix not in _TEXT_SUFFIXES + _TOKEN_SUFFIXES:
        raise ConfigError(
            f"{flag} file {path} has unsupported extension {path.suffix!r}; pass raw text (.txt) or token "
            "arrays (.npy, or raw .bin of uint16/uint32)."
        )
    try:
        size = path.stat().st_size
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConfigError(f"{flag} file {path} is a loop of symbolic links; point it at the file itself.") from exc
        raise ConfigError(f"{flag} file {path} does not exist; check the path.") from exc
    if not path.is_file():
        raise ConfigError(f"{flag} file {path} is not a regular file; pass the path of a file.")
    if size == 0:
        raise ConfigError(f"{flag} file {path} is empty.")
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as exc:
        raise ConfigError(f"{flag} file {path} cannot be read: {os_reason(exc)}.") from exc
    return "text" if suffix in _TEXT_SUFFIXES else "tokens"


def check_data_sources(cfg: DataConfig, vocab_size: int) -> str | None:
    """The cheap checks of where the data comes from (the files exist and read, their kinds agree, a BPE trained on
    text can have the vocabulary), made before anything slow runs. Returns "text" or "tokens" for the user's files,
    None for a built-in corpus."""
    if cfg.train_data is None:
        if cfg.val_data is not None:
            raise ConfigError("--val_data was given without --train_data; pass both, or only --train_data.")
        if cfg.tokenizer is not None:
            raise ConfigError(f"--tokenizer encodes your .txt --train_data; the built-in {cfg.dataset} has its own.")
        check_bpe_vocab(vocab_size)
        return None
    if cfg.dataset != DataConfig().dataset:
        raise ConfigError(f"--dataset {cfg.dataset} and --train_data name two sources of training data; drop one.")
    kind = _classify(Path(cfg.train_data).expanduser(), "--train_data")
    if kind == "text" and cfg.tokenizer is None:
        check_bpe_vocab(vocab_size)
    if cfg.tokenizer is not None and kind != "text":
        raise ConfigError(
            f"--tokenizer {cfg.tokenizer} encodes .txt data, but --train_data {cfg.train_data} is already tokens; drop "
            "--tokenizer."
        )
    if cfg.val_data is not None and _classify(Path(cfg.val_data).expanduser(), "--val_data") != kind:
        raise ConfigError(
            f"--train_data ({Path(cfg.train_data).name}) and --val_data ({Path(cfg.val_data).name}) must both be text "
            "(.txt) or both token arrays (.npy/.bin): text is tokenised with a BPE trained on the train file, which "
            "token arrays made elsewhere would not match."
        )
    return kind


def prepare_data(cfg: DataConfig, vocab_size: int) -> PreparedData:
    """Resolve ``cfg`` to train/val token arrays (memory-mapped), training and caching a tokenizer if needed."""
    cache = Path(cfg.cache_dir).expanduser() if cfg.cache_dir else default_cache_dir()
    kind = check_data_sources(cfg, vocab_size)
    if kind is None:
        if cfg.dataset == "stdlib":
            return _prepare_stdlib(cache, vocab_size)
        train_path, val_path = _download_tinystories()
        return _prepare_text(train_path, val_path, vocab_size, cache, "TinyStories V2 (GPT-4)", users=False)

    train_path = Path(cfg.train_data).expanduser()
    val_path = Path(cfg.val_data).expanduser() if cfg.val_data else None
    if kind == "text":
        return _prepare_text(train_path, val_path, vocab_size, cache, str(train_path), cfg.tokenizer)
    return _prepare_arrays(train_path, val_path, vocab_size)
