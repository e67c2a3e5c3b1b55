import os
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from cs336_basics.config import DataConfig
from cs336_basics.data import (
    END_OF_TEXT,
    BatchSampler,
    BPETokenizer,
    batching,
    check_data_sources,
    get_batch,
    load_token_array,
    prepare_data,
    sources,
    stdlib_source_files,
    token_dtype_for_vocab,
)
from cs336_basics.errors import ConfigError
from cs336_basics.files.atomic import HOST_TAG, TEMP_PREFIX, temp_prefix

SHAKESPEARE = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "tinyshakespeare.txt"


# ------------------------------------------------------------------------------------------- batching
def test_token_dtype_for_vocab():
    assert token_dtype_for_vocab(256) == np.uint16
    assert token_dtype_for_vocab(65536) == np.uint16
    assert token_dtype_for_vocab(65537) == np.uint32
    with pytest.raises(ConfigError):
        token_dtype_for_vocab(0)


def test_get_batch_shapes_and_shift():
    data = (np.arange(1000) * 7 % 997).astype(np.uint16)
    x, y = get_batch(data, 8, 16, "cpu", rng=np.random.default_rng(0))
    assert x.shape == y.shape == (8, 16)
    assert x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    source = torch.from_numpy(data.astype(np.int64))
    for row_x, row_y in zip(x, y, strict=True):
        # Locate the window in the source: values are distinct, so the first token pins the start.
        start = int(np.flatnonzero(data == row_x[0].item())[0])
        assert torch.equal(row_x, source[start : start + 16])
        assert torch.equal(row_y, source[start + 1 : start + 17])


def test_get_batch_only_valid_start():
    # len = context_length + 1: the only window that fits starts at 0.
    data = np.arange(5, dtype=np.uint16)
    x, y = get_batch(data, 32, 4, "cpu", rng=np.random.default_rng(1))
    assert (x == torch.arange(4)).all() and (y == torch.arange(1, 5)).all()


def test_get_batch_covers_all_starts_in_bounds():
    data = np.arange(20, dtype=np.uint32)
    x, y = get_batch(data, 2000, 5, "cpu", rng=np.random.default_rng(2))
    starts = set(x[:, 0].tolist())
    assert starts == set(range(20 - 5))  # every valid start is drawn, none past the end
    assert int(y.max()) == 19


def test_get_batch_deterministic_and_global_rng():
    data = np.arange(10_000, dtype=np.uint16)
    a = get_batch(data, 4, 32, "cpu", rng=np.random.default_rng(123))
    b = get_batch(data, 4, 32, "cpu", rng=np.random.default_rng(123))
    assert all(torch.equal(p, q) for p, q in zip(a, b, strict=True))
    np.random.seed(7)
    c = get_batch(data, 4, 32, "cpu")
    np.random.seed(7)
    d = get_batch(data, 4, 32, "cpu")
    assert all(torch.equal(p, q) for p, q in zip(c, d, strict=True))


def test_get_batch_context_too_long():
    data = np.arange(10, dtype=np.uint16)
    with pytest.raises(ConfigError, match="context_length 10 is longer than the data"):
        get_batch(data, 2, 10, "cpu")
    with pytest.raises(ConfigError, match="context_length"):
        BatchSampler(data, 2, 10, "cpu")


def test_get_batch_from_memmap(tmp_path):
    path = tmp_path / "t.npy"
    np.save(path, np.arange(3000, dtype=np.uint16))
    data = load_token_array(path, 4000)
    x, y = get_batch(data, 3, 8, "cpu", rng=np.random.default_rng(0))
    assert type(x) is torch.Tensor and torch.equal(x + 1, y)


@pytest.mark.gpu
def test_get_batch_cuda():
    data = np.arange(10_000, dtype=np.uint16)
    x, y = get_batch(data, 4, 64, "cuda", rng=np.random.default_rng(0))
    assert x.is_cuda and y.is_cuda and x.dtype == torch.int64
    assert torch.equal(x + 1, y)


def test_batch_sampler_state_round_trip(tmp_path):
    data = np.arange(50_000, dtype=np.uint16)
    sampler = BatchSampler(data, 4, 32, "cpu", seed=42)
    for _ in range(3):
        sampler.next_batch()
    # Through a checkpoint file, as a resumed run would do it.
    torch.save(sampler.state_dict(), tmp_path / "sampler.pt")
    expected = [sampler.next_batch() for _ in range(3)]

    resumed = BatchSampler(data, 4, 32, "cpu", seed=999)
    resumed.load_state_dict(torch.load(tmp_path / "sampler.pt", weights_only=True))
    for (x1, y1), (x2, y2) in zip(expected, [resumed.next_batch() for _ in range(3)], strict=True):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)
    # Same seed, same stream.
    a, b = BatchSampler(data, 4, 32, "cpu", seed=5), BatchSampler(data, 4, 32, "cpu", seed=5)
    assert torch.equal(a.next_batch()[0], b.next_batch()[0])


# ------------------------------------------------------------------------------------ load_token_array
@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_load_npy_round_trip(tmp_path, dtype):
    tokens = np.arange(0, 60_000, 7, dtype=dtype)
    np.save(tmp_path / "t.npy", tokens)
    arr = load_token_array(tmp_path / "t.npy", 60_000)
    assert isinstance(arr, np.memmap)  # memory-mapped, not read into RAM
    assert arr.dtype == dtype and np.array_equal(arr, tokens)


@pytest.mark.parametrize("vocab_size,dtype", [(1000, np.uint16), (100_000, np.uint32)])
def test_load_bin_round_trip(tmp_path, vocab_size, dtype):
    tokens = np.arange(vocab_size, dtype=dtype)[::3]
    tokens.tofile(tmp_path / "t.bin")
    arr = load_token_array(tmp_path / "t.bin", vocab_size)
    assert isinstance(arr, np.memmap)
    assert arr.dtype == dtype and np.array_equal(arr, tokens)


def test_load_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"missing\.npy does not exist"):
        load_token_array(tmp_path / "missing.npy", 100)

    for dtype in (np.int64, np.float32, np.int16):
        path = tmp_path / f"bad_{np.dtype(dtype).name}.npy"
        np.save(path, np.arange(10, dtype=dtype))
        with pytest.raises(ConfigError, match=rf"dtype {np.dtype(dtype).name}.*uint16 or uint32.*astype"):
            load_token_array(path, 100)

    np.save(tmp_path / "big_id.npy", np.array([1, 2, 300, 4], dtype=np.uint16))
    with pytest.raises(ConfigError, match=r"token id 300.*vocab_size is 256.*--vocab_size 301"):
        load_token_array(tmp_path / "big_id.npy", 256)

    (tmp_path / "tokens.pt").write_bytes(b"x")
    with pytest.raises(ConfigError, match=r"unsupported extension '\.pt'"):
        load_token_array(tmp_path / "tokens.pt", 100)

    np.save(tmp_path / "twod.npy", np.zeros((2, 3), dtype=np.uint16))
    with pytest.raises(ConfigError, match="must be 1-D"):
        load_token_array(tmp_path / "twod.npy", 100)

    np.save(tmp_path / "empty.npy", np.zeros(0, dtype=np.uint16))
    with pytest.raises(ConfigError, match="empty"):
        load_token_array(tmp_path / "empty.npy", 100)
    (tmp_path / "empty.bin").write_bytes(b"")
    with pytest.raises(ConfigError, match="empty"):
        load_token_array(tmp_path / "empty.bin", 100)

    (tmp_path / "odd.bin").write_bytes(b"abc")
    with pytest.raises(ConfigError, match="not a whole number of uint16"):
        load_token_array(tmp_path / "odd.bin", 100)

    (tmp_path / "corrupt.npy").write_bytes(b"not an npy file at all")
    with pytest.raises(ConfigError, match="is not a .npy file .it does not start with numpy's header"):
        load_token_array(tmp_path / "corrupt.npy", 100)
    np.save(tmp_path / "cut.npy", np.arange(100, dtype=np.uint16))
    (tmp_path / "cut.npy").write_bytes((tmp_path / "cut.npy").read_bytes()[:-20])  # its header, not its data
    with pytest.raises(ConfigError, match="Cannot read token file"):
        load_token_array(tmp_path / "cut.npy", 100)


def test_load_scans_every_chunk(tmp_path, monkeypatch):
    monkeypatch.setattr(batching, "_SCAN_CHUNK", 1000)
    tokens = np.zeros(10_500, dtype=np.uint16)
    tokens[-1] = 500  # in the last, partial chunk
    np.save(tmp_path / "t.npy", tokens)
    with pytest.raises(ConfigError, match="token id 500"):
        load_token_array(tmp_path / "t.npy", 500)
    assert len(load_token_array(tmp_path / "t.npy", 501)) == 10_500


# -------------------------------------------------------------------------------------- prepare_data
def _corpus(path: Path, n_lines: int, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    words = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "café", "naïve", "🎉", "x=1;", "def"]
    lines = [" ".join(rng.choice(words, size=rng.integers(3, 12))) for _ in range(n_lines)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _forbid_work(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("cache miss: this call should not train or encode")

    monkeypatch.setattr(BPETokenizer, "train", fail)
    monkeypatch.setattr(BPETokenizer, "encode_files", fail)


def test_prepare_text_and_cache_hit(tmp_path, monkeypatch):
    train_txt = _corpus(tmp_path / "train.txt", 2000, 0)
    val_txt = _corpus(tmp_path / "val.txt", 200, 1)
    cfg = DataConfig(train_data=str(train_txt), val_data=str(val_txt), cache_dir=str(tmp_path / "cache"))
    first = prepare_data(cfg, 400)
    assert first.tokenizer is not None and first.tokenizer.vocab_size <= 400
    assert first.train.dtype == first.val.dtype == np.uint16
    assert first.tokenizer.decode(first.train.tolist()) == train_txt.read_text() + END_OF_TEXT
    assert first.tokenizer.decode(first.val.tolist()) == val_txt.read_text() + END_OF_TEXT
    assert "val from val.txt" in first.description and "cache" in first.description

    cached = sorted(p for p in (tmp_path / "cache").rglob("*") if p.is_file())
    mtimes = [p.stat().st_mtime_ns for p in cached]
    assert not [p for p in cached if p.name.startswith(TEMP_PREFIX)]
    _forbid_work(monkeypatch)
    second = prepare_data(cfg, 400)
    assert np.array_equal(first.train, second.train) and np.array_equal(first.val, second.val)
    assert second.description == first.description
    assert [p.stat().st_mtime_ns for p in cached] == mtimes


def test_stale_temporary_files_in_the_data_cache_are_removed_live_ones_kept(tmp_path, dead_pid):
    train_txt = _corpus(tmp_path / "train.txt", 500, 0)
    cfg = DataConfig(train_data=str(train_txt), cache_dir=str(tmp_path / "cache"))
    prepare_data(cfg, 300)
    (entry,) = (tmp_path / "cache").iterdir()
    dead = temp_prefix("train", pid=dead_pid)
    stale = [entry / f"{dead}k1ll3d.bin", entry / f"{dead}x.npy"]
    stale_dir = entry / f"{temp_prefix('tokenizer', pid=dead_pid)}x"
    live = entry / f"{temp_prefix('val')}x.bin"  # this process's: an encoding still under way
    # Another machine's (a cache on a shared disk): its PID means nothing here.
    other = "0" * 8 if HOST_TAG != "0" * 8 else "1" * 8
    other_host = entry / f"{dead.replace(HOST_TAG, other)}x.bin"
    users = [entry / ".tmp-train-x.bin", tmp_path / "cache" / f"{dead}x.bin"]
    stale_dir.mkdir()
    for p in [*stale, stale_dir / "vocab.json", live, other_host, *users]:
        p.write_bytes(b"half a file")
    prepare_data(cfg, 300)
    assert not any(p.exists() for p in [*stale, stale_dir])
    assert all(p.exists() for p in [live, other_host, *users])


@pytest.mark.slow
def test_a_kill_during_encoding_leaves_a_temporary_file_the_next_run_removes(tmp_path):
    train_txt = _corpus(tmp_path / "train.txt", 2000, 0)
    cache = tmp_path / "cache"
    killed_mid_encoding = f"""
import os, signal
from cs336_basics.config import DataConfig
from cs336_basics.data import prepare_data, tokenizer

def write_then_die(self, batch, raw, *args):
    raw.write(b"half")
    raw.flush()
    os.kill(os.getpid(), signal.SIGKILL)

tokenizer.BPETokenizer._write_batch = write_then_die
prepare_data(DataConfig(train_data={str(train_txt)!r}, cache_dir={str(cache)!r}), 300)
"""
    proc = subprocess.Popen([sys.executable, "-c", killed_mid_encoding], stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, err
    (left,) = [p for p in cache.rglob(".*") if p.name.endswith(".bin")]
    assert left.name.startswith(temp_prefix("train", pid=proc.pid))
    data = prepare_data(DataConfig(train_data=str(train_txt), cache_dir=str(cache)), 300)
    assert len(data.train) > 0 and not left.exists()
    assert not [p for p in cache.rglob(".*") if p.name.startswith(TEMP_PREFIX)]


def test_prepare_text_held_out(tmp_path):
    train_txt = _corpus(tmp_path / "train.txt", 2000, 0)
    data = prepare_data(DataConfig(train_data=str(train_txt), cache_dir=str(tmp_path / "c")), 300)
    total = len(data.train) + len(data.val)
    assert len(data.val) == int(np.ceil(total * 0.05))
    assert data.tokenizer.decode(np.concatenate([data.train, data.val]).tolist()).startswith(train_txt.read_text())
    assert "last 5% of train held out" in data.description


def test_prepare_text_retrains_when_file_changes(tmp_path):
    train_txt = _corpus(tmp_path / "train.txt", 500, 0)
    cfg = DataConfig(train_data=str(train_txt), cache_dir=str(tmp_path / "c"))
    a = prepare_data(cfg, 300)
    _corpus(train_txt, 600, 3)
    os.utime(train_txt, ns=(1, 1))  # a different mtime even on coarse-timestamp filesystems
    b = prepare_data(cfg, 300)
    assert len(a.train) != len(b.train)


def test_prepare_text_rebuilds_a_file_changed_behind_a_restored_mtime(tmp_path):
    """cp -p, rsync -a, tar x or touch -d give a changed file its old mtime back (here: same size too); its ctime,
    which no tool sets, still tells the cache that it changed."""
    train_txt = tmp_path / "train.txt"
    train_txt.write_text("alpha beta gamma delta\n" * 400)
    cfg = DataConfig(train_data=str(train_txt), cache_dir=str(tmp_path / "c"))
    before = prepare_data(cfg, 300)
    stat = train_txt.stat()
    time.sleep(0.05)  # a later ctime even where the kernel stamps it once per clock tick
    train_txt.write_text("ALPHA BETA GAMMA DELTA\n" * 400)
    os.utime(train_txt, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    after = prepare_data(cfg, 300)
    assert after.tokenizer.decode(after.train[:6].tolist()).startswith("ALPHA")
    assert before.tokenizer.decode(before.train[:6].tolist()).startswith("alpha")


@pytest.mark.parametrize(
    "content, message",
    [
        ("résumé naïve café\n".encode("latin-1") * 50, r"not UTF-8 text: near byte 1 .*iconv -f LATIN1"),
        ("the cat sat\n".encode("utf-16") * 50, r"starts with UTF-16's byte-order mark.*iconv -f UTF-16"),
    ],
    ids=["latin1", "utf16"],
)
def test_text_that_is_not_utf8_is_refused_not_trained_on_as_replacement_characters(tmp_path, content, message):
    (tmp_path / "train.txt").write_bytes(content)
    with pytest.raises(ConfigError, match=message):
        prepare_data(DataConfig(train_data=str(tmp_path / "train.txt"), cache_dir=str(tmp_path / "c")), 300)


def test_validation_data_that_is_the_training_data_is_named_as_such(tmp_path):
    train_txt = _corpus(tmp_path / "train.txt", 300, 0)
    (tmp_path / "copy.txt").write_bytes(train_txt.read_bytes())
    for val in (train_txt, tmp_path / "copy.txt"):
        cfg = DataConfig(train_data=str(train_txt), val_data=str(val), cache_dir=str(tmp_path / "c"))
        assert "the training data itself" in prepare_data(cfg, 300).description
    np.save(tmp_path / "t.npy", np.arange(100, dtype=np.uint16))
    assert (
        "the training data itself"
        in prepare_data(
            DataConfig(train_data=str(tmp_path / "t.npy"), val_data=str(tmp_path / "t.npy")), 128
        ).description
    )
    other = DataConfig(
        train_data=str(train_txt), val_data=str(_corpus(tmp_path / "v.txt", 50, 1)), cache_dir=str(tmp_path / "c")
    )
    assert "itself" not in prepare_data(other, 300).description


def test_a_vocabulary_larger_than_the_text_gives_is_named(tmp_path):
    train_txt = _corpus(tmp_path / "train.txt", 300, 0)
    data = prepare_data(DataConfig(train_data=str(train_txt), cache_dir=str(tmp_path / "c")), 5000)
    fits = data.tokenizer.vocab_size
    assert (
        fits < 5000 and f"embedding rows above the BPE's are never used (--vocab_size {fits} fits" in data.description
    )


def test_data_sources_refused_before_any_work(tmp_path, monkeypatch):
    _forbid_work(monkeypatch)
    text = _corpus(tmp_path / "a.txt", 50, 0)
    with pytest.raises(ConfigError, match="--dataset tinystories and --train_data name two sources"):
        check_data_sources(DataConfig(dataset="tinystories", train_data=str(text)), 300)
    with pytest.raises(ConfigError, match="vocab_size 256 is too small for byte-level BPE"):
        check_data_sources(DataConfig(train_data=str(text)), 256)
    with pytest.raises(ConfigError, match="vocab_size 100 is too small"):
        check_data_sources(DataConfig(), 100)  # the built-in corpus trains one too
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(ConfigError, match="empty.txt is empty"):
        check_data_sources(DataConfig(train_data=str(tmp_path / "empty.txt")), 300)
    (tmp_path / "loop1.txt").symlink_to(tmp_path / "loop2.txt")
    (tmp_path / "loop2.txt").symlink_to(tmp_path / "loop1.txt")
    with pytest.raises(ConfigError, match="is a loop of symbolic links"):
        check_data_sources(DataConfig(train_data=str(tmp_path / "loop1.txt")), 300)

    def unreadable(path, mode="r", *args, **kwargs):  # what a file without read permission gives (root reads any)
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(sources, "open", unreadable, raising=False)
    with pytest.raises(ConfigError, match="a.txt cannot be read: permission denied"):
        check_data_sources(DataConfig(train_data=str(text)), 300)


def test_a_cache_dir_that_is_a_file_is_named_as_such(tmp_path):
    (tmp_path / "cache").write_text("not a folder")
    cfg = DataConfig(train_data=str(_corpus(tmp_path / "a.txt", 50, 0)), cache_dir=str(tmp_path / "cache"))
    with pytest.raises(ConfigError, match=r"data cache .*cache \(a file of that name is in the way\)"):
        prepare_data(cfg, 300)


def test_token_files_a_wrong_reading_would_garble_are_refused(tmp_path):
    np.arange(1, 1001, dtype=np.uint32).tofile(tmp_path / "u32.bin")  # read as uint16: every other value 0
    with pytest.raises(ConfigError, match="looks like uint32 ids read as uint16"):
        load_token_array(tmp_path / "u32.bin", 2000)
    (np.arange(1000, dtype=np.uint16) + 7).tofile(tmp_path / "u16.bin")  # read as uint32: ids of two halves
    with pytest.raises(ConfigError, match="If it holds uint16 ids .read as uint32.*save them as .npy"):
        load_token_array(tmp_path / "u16.bin", 70000)
    np.save(tmp_path / "neg.npy", np.array([3, -1, 5], dtype=np.int32))
    with pytest.raises(ConfigError, match="holds negative ids .the smallest is -1"):
        load_token_array(tmp_path / "neg.npy", 100)


def test_prepare_token_arrays(tmp_path):
    np.save(tmp_path / "train.npy", np.arange(1000, dtype=np.uint16) % 50)
    np.arange(100, dtype=np.uint16).tofile(tmp_path / "val.bin")
    data = prepare_data(DataConfig(train_data=str(tmp_path / "train.npy"), val_data=str(tmp_path / "val.bin")), 128)
    assert data.tokenizer is None
    assert len(data.train) == 1000 and len(data.val) == 100

    held = prepare_data(DataConfig(train_data=str(tmp_path / "train.npy")), 128)
    assert len(held.train) == 950 and len(held.val) == 50
    assert np.array_equal(held.val, np.arange(950, 1000) % 50)
    assert "held out" in held.description

    with pytest.raises(ConfigError, match="token id 99"):
        prepare_data(DataConfig(train_data=str(tmp_path / "train.npy"), val_data=str(tmp_path / "val.bin")), 60)


def test_prepare_errors(tmp_path):
    (tmp_path / "a.txt").write_text("hello\n")
    np.save(tmp_path / "b.npy", np.arange(10, dtype=np.uint16))
    with pytest.raises(ConfigError, match="does not exist"):
        prepare_data(DataConfig(train_data=str(tmp_path / "missing.txt")), 300)
    with pytest.raises(ConfigError, match="does not exist"):
        prepare_data(DataConfig(train_data=str(tmp_path / "missing.npy")), 300)
    with pytest.raises(ConfigError, match="does not exist"):
        prepare_data(DataConfig(train_data=str(tmp_path / "a.txt"), val_data=str(tmp_path / "nope.txt")), 300)
    with pytest.raises(ConfigError, match="unsupported extension"):
        prepare_data(DataConfig(train_data=str(tmp_path / "data.parquet")), 300)
    with pytest.raises(ConfigError, match="must both be text"):
        prepare_data(DataConfig(train_data=str(tmp_path / "a.txt"), val_data=str(tmp_path / "b.npy")), 300)
    with pytest.raises(ConfigError, match="without --train_data"):
        prepare_data(DataConfig(val_data=str(tmp_path / "b.npy")), 300)
    with pytest.raises(ConfigError, match="dataset must be one of stdlib, tinystories; got 'wikipedia'"):
        prepare_data(DataConfig(dataset="wikipedia"), 300)


def test_tinystories_offline_error(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # An empty hub cache, so a copy downloaded earlier on this machine cannot satisfy the request.
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ConfigError, match=r"Downloading TinyStories.*failed: .*--train_data/--val_data") as info:
        prepare_data(DataConfig(dataset="tinystories", cache_dir=str(tmp_path / "c")), 300)
    assert "roneneldan/TinyStories" in str(info.value)


def test_tinystories_is_read_from_the_hub_cache_without_asking_the_network(tmp_path, monkeypatch):
    """Cached files are used as they are (the dataset never changes); the network is asked only for a file the cache
    lacks, and never with HF_HUB_OFFLINE."""
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    from cs336_basics.data import sources

    cached, calls = {"TinyStoriesV2-GPT4-train.txt"}, []

    def hub(repo, name, repo_type, local_files_only=False):
        calls.append((name, local_files_only))
        if local_files_only and name not in cached:
            raise LocalEntryNotFoundError(f"{name} is not cached")
        return str(tmp_path / name)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", hub)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    assert sources._download_tinystories() == tuple(tmp_path / name for name in sources.TINYSTORIES_FILES)
    train, val = sources.TINYSTORIES_FILES
    assert calls == [(train, True), (val, True), (val, False)]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match=f"{val} is not cached"):
        sources._download_tinystories()


def test_stdlib_source_files():
    files = stdlib_source_files()
    root = Path(sysconfig.get_paths()["stdlib"])
    assert len(files) > 500
    assert root / "os.py" in files
    assert not [p for p in files if {"site-packages", "dist-packages"} & set(p.parts)]
    assert files == sorted(files, key=lambda p: p.relative_to(root).as_posix())


def test_prepare_stdlib_subset(tmp_path, monkeypatch):
    # The real pipeline on 60 small stdlib files: the full library takes ~20 s, too slow for unit tests.
    subset = sorted(stdlib_source_files(), key=lambda p: p.stat().st_size)[700:760]
    subset.sort(key=lambda p: p.relative_to(sysconfig.get_paths()["stdlib"]).as_posix())
    monkeypatch.setattr(sources, "stdlib_source_files", lambda: subset)
    cfg = DataConfig(cache_dir=str(tmp_path / "cache"))
    data = prepare_data(cfg, 500)
    assert data.tokenizer is not None and data.tokenizer.vocab_size == 500
    # File-level split: files 20, 40, 60 (1-based) are validation; each ends with one <|endoftext|>.
    val_files = subset[19::20]
    assert int((data.val == data.tokenizer.eot_id).sum()) == len(val_files) == 3
    assert int((data.train == data.tokenizer.eot_id).sum()) == 57
    expected_val = "".join(p.read_bytes().decode(errors="replace") + END_OF_TEXT for p in val_files)
    assert data.tokenizer.decode(data.val.tolist()) == expected_val
    assert "Python stdlib source (60 files" in data.description

    _forbid_work(monkeypatch)
    again = prepare_data(cfg, 500)
    assert np.array_equal(again.train, data.train) and again.description == data.description


def test_prepare_tinyshakespeare(tmp_path):
    if not SHAKESPEARE.is_file():
        pytest.skip(f"{SHAKESPEARE} not present")
    data = prepare_data(DataConfig(train_data=str(SHAKESPEARE), cache_dir=str(tmp_path)), 512)
    assert data.tokenizer.vocab_size == 512
    text = SHAKESPEARE.read_text()
    # BPE with 255 merges compresses English roughly 2x.
    assert len(data.train) + len(data.val) < len(text) / 1.8
    x, y = get_batch(data.train, 4, 64, "cpu", rng=np.random.default_rng(0))
    assert torch.equal(x[:, 1:], y[:, :-1])
