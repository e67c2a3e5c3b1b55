"""Atomic, exactly-resumable checkpoints that load with `torch.load(weights_only=True)`.

A checkpoint holds everything a resumed run needs to continue bit for bit: model weights (of the uncompiled
module, so keys never depend on torch.compile), optimizer state, step, the run's config, the data sampler's
position, and the python / numpy / torch (CPU and CUDA) RNG states.

A run trained with FSDP2 writes a sharded checkpoint instead (cs336_basics/training/sharded_checkpoint.py): the same
`checkpoint.pt`, in format v1-sharded, holding everything but the tensors, which sit in the shard folder it names.
`read_checkpoint` reads either; training/restore.py restores either into either kind of model (a sharded checkpoint
into an unsharded model, one process or DDP, by first assembling its tensors into this layout).

Why checked on every read: torch.load does not check the CRC-32s torch.save writes, so a flipped bit in a weight would
load silently; read_checkpoint checks them (cs336_basics/files/integrity.py) before anything else reads the file.

Why weights_only-safe: unpickling can run arbitrary code, and a checkpoint is exactly the kind of file people
download and share. So the payload is restricted to plain dicts, lists, tuples, numbers, strings, None and
tensors (numpy's RNG state is converted to Python ints), and loading always uses weights_only=True.
"""

from __future__ import annotations

import os
import random
import shutil
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from cs336_basics.compiled import plain_name, unwrap
from cs336_basics.errors import ConfigError
from cs336_basics.files.integrity import save_torch_file, verify_files, verify_zip

__all__ = [
    "CHECKPOINT_FORMAT",
    "CHECKPOINT_NAME",
    "SHARDED_FORMAT",
    "SHARDS_DIR",
    "checkpoint_payload",
    "check_model_keys",
    "checkpoint_file",
    "load_model_state",
    "model_state",
    "read_checkpoint",
    "remove_stale_shards",
    "save_checkpoint",
]

CHECKPOINT_NAME = "checkpoint.pt"
CHECKPOINT_FORMAT = "cs336_basics.checkpoint/v1"
# checkpoint.pt of an FSDP2 run: v1's keys but "model" and the optimizer's tensors, which are in SHARDS_DIR/<"shards">.
SHARDED_FORMAT = "cs336_basics.checkpoint/v1-sharded"
SHARDS_DIR = "checkpoint.shards"


def checkpointed_keys(model: nn.Module) -> dict[str, str]:
    """The state-dict entries a checkpoint of `model` holds, as plain key -> the module's own key (which carries
    compile prefixes where submodules were compiled in place; plain names undo them). All of them, unless some
    parameters are frozen (a LoRA fine-tune): then the trainable ones only, as the frozen ones are the base model's,
    which the run's config names (finetune.init_from)."""
    module = unwrap(model)
    own = {plain_name(k): k for k in module.state_dict()}
    params = list(module.named_parameters())
    if all(p.requires_grad for _, p in params):
        return own
    trainable = {plain_name(n) for n, p in params if p.requires_grad}
    return {k: v for k, v in own.items() if k in trainable}


def model_state(model: nn.Module) -> OrderedDict[str, torch.Tensor]:
    """What a checkpoint holds of the model, whatever wraps it (torch.compile, DDP), under plain keys."""
    state = unwrap(model).state_dict()
    return OrderedDict((plain, state[key]) for plain, key in checkpointed_keys(model).items())


# ---- keeping the payload weights_only-safe ----
def _plain(obj: Any, where: str) -> Any:
    """`obj` made of types torch.load(weights_only=True) accepts; common near-misses are converted.

    Fails at save time, naming the offending entry, rather than writing a file that cannot be loaded.
    """
    if obj is None or isinstance(obj, bool | int | float | str | torch.Tensor | torch.dtype | torch.device):
        return obj
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if isinstance(obj, np.generic):  # numpy scalar -> Python scalar
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, dict):
        return {k: _plain(v, f"{where}.{k}") for k, v in obj.items()}
    if isinstance(obj, tuple | list):
        out = [_plain(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        return tuple(out) if isinstance(obj, tuple) else out
    raise TypeError(
        f"checkpoint entry {where} has type {type(obj).__name__}, which torch.load(weights_only=True) cannot "
        "read back; store it as plain dicts/lists/numbers/strings/tensors."
    )


# ---- RNG ----
def _rng_state() -> dict[str, Any]:
    version, internal, gauss_next = random.getstate()
    name, keys, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    cuda = None
    # Only when CUDA is already in use: querying it would otherwise initialise a CUDA context for nothing.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        cuda = torch.cuda.get_rng_state_all()
    return {
        "python": [version, list(internal), gauss_next],
        "numpy": {
            "name": str(name),
            "keys": [int(k) for k in keys],
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "torch": torch.get_rng_state(),
        "cuda": cuda,
    }


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    npy = state["numpy"]
    np.random.set_state(
        (npy["name"], np.asarray(npy["keys"], dtype=np.uint32), npy["pos"], npy["has_gauss"], npy["cached_gaussian"])
    )
    torch.set_rng_state(state["torch"].cpu())  # set_rng_state wants a CPU ByteTensor whatever map_location was
    cuda = state.get("cuda")
    if cuda and torch.cuda.is_available():
        n = torch.cuda.device_count()
        if len(cuda) != n:
            warnings.warn(
                f"checkpoint has CUDA RNG states for {len(cuda)} device(s), this machine has {n}; "
                f"restoring the first {min(n, len(cuda))}.",
                stacklevel=3,
            )
        for i, s in enumerate(cuda[:n]):
            torch.cuda.set_rng_state(s.cpu(), device=i)


# ---- public API ----
def checkpoint_payload(
    *,
    model: dict | None,
    optimizer: dict | None,
    step: int,
    config: dict,
    sampler_state: dict | None = None,
    extra: dict | None = None,
    rng: dict | None = None,
    format: str = CHECKPOINT_FORMAT,
    **more: Any,
) -> dict[str, Any]:
    """What a checkpoint file holds, checked to load with weights_only=True: `model` a state dict (plain keys),
    `optimizer` the optimizer's state dict, `rng` this process's RNG states unless given."""
    return {
        "format": format,
        "torch_version": str(torch.__version__),
        "step": int(step),
        # Tensors stay as they are (torch.save copies device tensors to the file itself). Storage shared
        # between model and optimizer (fp32 weights are their own masters) is written once.
        "model": model,
        "optimizer": _plain(optimizer, "optimizer") if optimizer is not None else None,
        "config": _plain(config, "config"),
        "sampler_state": _plain(sampler_state, "sampler_state"),
        "extra": _plain(extra, "extra"),
        "rng": rng if rng is not None else _rng_state(),
        **_plain(more, "checkpoint"),
    }


def save_checkpoint(
    path: str | os.PathLike,
    *,
    model: nn.Module,
    optimizer: Any,
    step: int,
    config: dict,
    sampler_state: dict | None = None,
    extra: dict | None = None,
) -> Path:
    """Atomically write a checkpoint to `path` and return it as a Path.

    `model` may be the torch.compile wrapper: the uncompiled module's state is saved either way.
    `optimizer` is anything with state_dict() (MasterWeightAdamW, a torch optimizer) or None.
    """
    path = Path(path)
    payload = checkpoint_payload(
        model=model_state(model),
        optimizer=optimizer.state_dict() if optimizer is not None else None,
        step=step,
        config=config,
        sampler_state=sampler_state,
        extra=extra,
    )
    return save_torch_file(path, payload)


def read_checkpoint(
    path: str | os.PathLike, map_location: str | torch.device | None = "cpu", mmap: bool = False
) -> dict[str, Any]:
    """Read and check a checkpoint written by save_checkpoint, restoring nothing: "step", "config",
    "sampler_state", "extra", "model", "optimizer", "rng", "torch_version", "format". `mmap`: map the file's tensors
    instead of reading them (the ranks of one machine then share one copy in the page cache). The file's checksums
    (and a sharded checkpoint's, of its shard files) are checked first: a damaged file is a ChecksumError naming it."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(
            f"no checkpoint file at {path}; check the path (a run writes its checkpoint as "
            f"<out_dir>/{CHECKPOINT_NAME}, from its first --checkpoint_every steps on)."
        )
    checked = verify_zip(path)
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as e:  # torn zip, random bytes, empty file, disallowed pickle content, ...
        msg = str(e).strip()
        if "Weights only load failed" in msg:
            # torch's own text suggests weights_only=False, the wrong advice for a file we did not write.
            detail = "it holds objects other than tensors and plain Python data"
        else:
            detail = f"{type(e).__name__}: {msg.splitlines()[0][:200] if msg else 'no details'}"
        raise ConfigError(
            f"{path} is not a readable checkpoint ({detail}); it may be truncated or corrupt, or was not "
            "written by cs336_basics. Delete it, or point at another checkpoint."
        ) from e
    if not isinstance(ckpt, dict) or ckpt.get("format") not in (CHECKPOINT_FORMAT, SHARDED_FORMAT):
        found = ckpt.get("format") if isinstance(ckpt, dict) else type(ckpt).__name__
        raise ConfigError(
            f"{path} is not a cs336_basics checkpoint (format {found!r}, expected {CHECKPOINT_FORMAT!r}); "
            "point at a checkpoint written by this package's trainer."
        )
    if not checked:
        raise ConfigError(
            f"{path} carries no checksums (it was not written by torch.save with its CRC-32s on), so it cannot be "
            "checked; point at a checkpoint written by this package's trainer."
        )
    ckpt["path"] = str(path)
    if ckpt["format"] == SHARDED_FORMAT:
        shards = path.parent / SHARDS_DIR / ckpt["shards"]
        if not (shards / ".metadata").is_file():
            raise ConfigError(
                f"{path} is a sharded checkpoint whose tensors should be in {shards}, which is missing or incomplete; "
                "the run folder was changed by hand. Point at another checkpoint."
            )
        # Sharded checkpoints written before shard checksums existed have none; checkpoint.pt itself is checked.
        verify_files(shards, ckpt.get("shard_crc32", {}))
        ckpt["shards_path"] = str(shards)
    return ckpt


def is_sharded_checkpoint(ckpt: dict[str, Any]) -> bool:
    return ckpt.get("format") == SHARDED_FORMAT


def check_model_keys(model: nn.Module, keys: Any, path: str) -> dict[str, str]:
    """A ConfigError unless the checkpoint's model `keys` (plain names) are exactly the model's; returns plain key ->
    the module's own key (which carries compile prefixes where submodules were compiled in place)."""
    own = checkpointed_keys(model)
    missing = sorted(set(own) - set(keys))
    unexpected = sorted(set(keys) - set(own))
    if missing or unexpected:
        raise ConfigError(
            f"{path} does not fit this model: missing keys {missing[:10] or 'none'}"
            f"{' ...' if len(missing) > 10 else ''}, unexpected keys {unexpected[:10] or 'none'}"
            f"{' ...' if len(unexpected) > 10 else ''}. Build the model with the config stored in the checkpoint."
        )
    return own


def load_model_state(model: nn.Module, state: dict[str, torch.Tensor], path: str) -> None:
    """Load a checkpoint's model state (plain keys) strictly into `model`, whatever wraps it; a ConfigError says
    which keys or shapes do not fit."""
    module = unwrap(model)
    own = check_model_keys(module, state, path)
    try:
        # strict unless the checkpoint holds the trainable tensors alone (check_model_keys checked those).
        module.load_state_dict({own[k]: v for k, v in state.items()}, strict=len(own) == len(module.state_dict()))
    except RuntimeError as e:  # shape mismatches
        raise ConfigError(
            f"{path} does not fit this model: {e}. Build the model with the config stored in the checkpoint."
        ) from e


def referenced_shards(out_dir: str | os.PathLike) -> str | None | bool:
    """The shard folder the run's checkpoint.pt names; None if it names none (no checkpoint, or a whole one); False
    if checkpoint.pt cannot be read (then nothing may be deleted)."""
    path = Path(out_dir) / CHECKPOINT_NAME
    if not path.is_file():
        return None
    try:  # mmap: a whole checkpoint of several GB is not read just to learn it names no shards
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - an unreadable checkpoint: keep every shard folder
        return False
    return ckpt.get("shards") if isinstance(ckpt, dict) and ckpt.get("format") == SHARDED_FORMAT else None


def remove_stale_shards(out_dir: str | os.PathLike) -> list[Path]:
    """Delete the shard folders checkpoint.pt does not name: older checkpoints', and those of writes a crash cut short
    (checkpoint.pt is written only after its shards are complete, so it never names one of those)."""
    keep = referenced_shards(out_dir)
    root = Path(out_dir) / SHARDS_DIR
    if keep is False or not root.is_dir():
        return []
    stale = [p for p in root.iterdir() if p.name != keep]
    for p in stale:
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    if keep is None:
        root.rmdir()
    return stale


def checkpoint_file(source: str | os.PathLike) -> Path:
    """The checkpoint a path names: a run folder's (the trainer keeps one there, overwritten atomically), or the path
    itself where it is not a folder. Whether the file exists is the caller's to check (read_checkpoint says so)."""
    path = Path(source)
    return path / CHECKPOINT_NAME if path.is_dir() else path
