"""Token arrays on disk and random training windows drawn from them.

Token arrays are memory-mapped: a multi-GB corpus costs no RAM up front, and the OS page cache keeps the
hot parts resident. Batches are gathered with one vectorised fancy index, so drawing a batch costs
microseconds next to a training step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from cs336_basics.errors import ConfigError

# Largest vocabulary whose ids all fit in uint16 (ids 0..65535).
_UINT16_VOCAB_LIMIT = 1 << 16
_NPY_MAGIC = b"\x93NUMPY"
# Elements per np.max call when validating ids: 64 Mi uint16 = 128 MiB, bounded memory for any file size.
_SCAN_CHUNK = 1 << 26


def token_dtype_for_vocab(vocab_size: int) -> np.dtype:
    """The narrowest unsigned dtype that holds every id of the vocabulary (the course's convention)."""
    if vocab_size < 1:
        raise ConfigError(f"vocab_size must be a positive integer, got {vocab_size}.")
    return np.dtype(np.uint16) if vocab_size <= _UINT16_VOCAB_LIMIT else np.dtype(np.uint32)


def _reencode_hint(path: Path, vocab_size: int) -> str:
    dtype = token_dtype_for_vocab(vocab_size).name
    return f"re-encode it with np.save({str(path)!r}, np.asarray(tokens).astype(np.{dtype}))"


def _max_token_id(arr: np.ndarray) -> int:
    # Chunked so a memmap larger than RAM is streamed through once instead of materialised.
    return max(int(arr[i : i + _SCAN_CHUNK].max()) for i in range(0, len(arr), _SCAN_CHUNK))


def load_token_array(path: str | Path, vocab_size: int) -> np.ndarray:
    """Memory-map a 1-D array of token ids (``.npy``, or headerless ``.bin`` of the vocab's dtype).

    Every id is checked against ``vocab_size`` here, once, because an out-of-range id would otherwise
    surface much later as an opaque CUDA indexing assert in the embedding layer.
    """
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"Token file {path} does not exist; check the path given to --train_data/--val_data.")
    if not path.is_file():
        raise ConfigError(f"Token file {path} is not a regular file; pass the path of a .npy or .bin file.")
    suffix = path.suffix.lower()
    if suffix == ".npy":
        try:
            with open(path, "rb") as f:
                magic = f.read(len(_NPY_MAGIC))
            arr = np.load(path, mmap_mode="r", allow_pickle=False) if magic == _NPY_MAGIC else None
        except PermissionError as exc:
            raise ConfigError(f"Cannot read token file {path} ({exc}); check its permissions.") from exc
        except (OSError, ValueError, EOFError) as exc:
            raise ConfigError(
                f"Cannot read token file {path} as a .npy array ({exc}); check that it was written with np.save."
            ) from exc
        if arr is None:
            raise ConfigError(
                f"Token file {path} is not a .npy file (it does not start with numpy's header); write it with "
                "np.save, or name raw uint16/uint32 tokens .bin."
            )
        if not isinstance(arr, np.ndarray):
            raise ConfigError(f"Token file {path} holds {type(arr).__name__}, not one array; save one 1-D array.")
        # Any byte order is fine (numpy converts on read); only the width and signedness matter.
        smallest = arr.min() if arr.dtype.kind in "if" and arr.size else 0  # one pass; unsigned ids are never below 0
        if smallest < 0:  # the cast the hint below suggests would wrap them
            raise ConfigError(
                f"Token file {path} holds negative ids (the smallest is {smallest}); token ids are 0 .. vocab_size - "
                "1. Drop or replace them, then save the array as uint16 or uint32."
            )
        if arr.dtype.kind != "u" or arr.dtype.itemsize not in (2, 4):
            raise ConfigError(
                f"Token file {path} has dtype {arr.dtype}, but token arrays must be uint16 or uint32; "
                f"{_reencode_hint(path, vocab_size)}."
            )
    elif suffix == ".bin":
        dtype = token_dtype_for_vocab(vocab_size)
        size = path.stat().st_size
        if size % dtype.itemsize:
            raise ConfigError(
                f"Token file {path} is {size} bytes, not a whole number of {dtype.name} tokens; a raw .bin is "
                f"read as {dtype.name} because --vocab_size is {vocab_size} (uint16 up to 65536, uint32 above). "
                "Check --vocab_size, or save the tokens as .npy so the dtype travels with them."
            )
        if size == 0:
            raise ConfigError(f"Token file {path} is empty; it needs at least context_length + 1 tokens.")
        try:
            arr = np.memmap(path, dtype=dtype, mode="r")
        except (OSError, ValueError) as exc:
            raise ConfigError(f"Cannot read token file {path} ({exc}); check its permissions.") from exc
        head = arr[: 1 << 20]
        if dtype == np.uint16 and len(head) % 2 == 0 and head[1::2].max() == 0 < head[0::2].max():
            raise ConfigError(
                f"Token file {path} looks like uint32 ids read as uint16 (every other 16-bit value is 0): a raw .bin "
                f"is read as uint16 because --vocab_size is {vocab_size} (uint16 up to 65536, uint32 above). Save "
                "the tokens as .npy, so that the dtype travels with them."
            )
    else:
        raise ConfigError(
            f"Token file {path} has unsupported extension {path.suffix!r}; use .npy (np.save of a uint16/uint32 "
            "array) or .bin (raw uint16/uint32 tokens), or pass a .txt file to have it tokenised."
        )
    if arr.ndim != 1:
        raise ConfigError(
            f"Token file {path} has shape {arr.shape}, but token arrays must be 1-D (one long token stream); "
            f"flatten it with arr.reshape(-1) and save it again."
        )
    if arr.size == 0:
        raise ConfigError(f"Token file {path} is empty; it needs at least context_length + 1 tokens.")
    max_id = _max_token_id(arr)
    if max_id >= vocab_size:
        uint16_as_uint32 = suffix == ".bin" and arr.dtype == np.uint32 and max_id >= _UINT16_VOCAB_LIMIT
        raise ConfigError(
            f"Token file {path} contains token id {max_id}, but vocab_size is {vocab_size} (ids must be "
            f"< vocab_size); pass --vocab_size {max_id + 1} or larger (the tokenizer's vocabulary size)."
            + (
                " If it holds uint16 ids (read as uint32 because --vocab_size is above 65536), save them as .npy."
                if uint16_as_uint32
                else ""
            )
        )
    return arr


def require_windows(n_tokens: int, context_length: int, what: str = "the data", more: str = "more data") -> None:
    """Every training window needs context_length + 1 tokens (inputs and their shifted targets)."""
    if n_tokens <= context_length:
        raise ConfigError(
            f"context_length {context_length} is longer than {what} ({n_tokens} tokens); every window needs "
            f"context_length + 1 tokens. Use a smaller --context_length or {more}."
        )


def get_batch(
    data: np.ndarray,
    batch_size: int,
    context_length: int,
    device: str | torch.device,
    rng: np.random.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample ``batch_size`` random windows: inputs ``x`` and next-token targets ``y``, int64 ``(B, T)``.

    Without ``rng`` the global ``np.random`` state is used, so ``np.random.seed`` controls it as in the
    course's reference tests.
    """
    n = len(data)
    require_windows(n, context_length)
    # Highest start whose window (context_length inputs + 1 shifted target) still ends inside the data.
    high = n - context_length - 1
    if rng is None:
        starts = np.random.randint(0, high + 1, size=batch_size)
    else:
        starts = rng.integers(0, high + 1, size=batch_size)
    return _windows(data, starts, context_length, device)


def get_rank_batch(
    data: np.ndarray,
    batch_size: int,
    context_length: int,
    device: str | torch.device,
    rng: np.random.Generator,
    rank: int = 0,
    world_size: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's ``batch_size`` windows of a global batch of ``batch_size * world_size`` drawn from ``rng``.

    Every rank draws the whole global batch's start positions (microseconds) from the same generator and gathers only
    its own rows, so the ranks read different windows, the generator advances identically everywhere (one state to
    save and resume), and the global batch is the one a single process with ``batch_size * world_size`` would draw.
    With ``world_size`` 1 this is ``get_batch`` with ``rng``.
    """
    require_windows(len(data), context_length)
    starts = rng.integers(0, len(data) - context_length, size=batch_size * world_size)
    return _windows(data, starts[rank * batch_size : (rank + 1) * batch_size], context_length, device)


def _windows(
    data: np.ndarray, starts: np.ndarray, context_length: int, device: str | torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    # One gather of (B, T + 1) ids; x and y are the two overlapping views of it, so each token is read once.
    windows = np.asarray(data[starts[:, None] + np.arange(context_length + 1)]).astype(np.int64)
    batch = torch.from_numpy(windows)
    device = torch.device(device)
    if device.type == "cuda":
        # Pinned host memory lets the copy run asynchronously, overlapping the previous step's compute.
        batch = batch.pin_memory().to(device, non_blocking=True)
    elif device.type != "cpu":
        batch = batch.to(device)
    return batch[:, :-1].contiguous(), batch[:, 1:].contiguous()


class BatchSampler:
    """Random training batches with their own seeded generator, so a resumed run sees the same batches.

    Under data parallelism each rank gets its own ``batch_size`` rows of every global batch (``get_rank_batch``): the
    windows a rank reads are fixed by (seed, rank, step), and the sampler's state is the same on every rank."""

    def __init__(
        self,
        data: np.ndarray,
        batch_size: int,
        context_length: int,
        device: str | torch.device,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        require_windows(len(data), context_length)  # at construction, before any training work
        self.data = data
        self.batch_size = batch_size
        self.context_length = context_length
        self.device = torch.device(device)
        self.rng = np.random.default_rng(seed)
        self.rank, self.world_size = rank, world_size

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        return get_rank_batch(
            self.data, self.batch_size, self.context_length, self.device, self.rng, self.rank, self.world_size
        )

    def state_dict(self) -> dict[str, Any]:
        # The bit generator state is plain dicts and ints: safe for torch.save(weights_only) and JSON.
        return {"bit_generator": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["bit_generator"]
