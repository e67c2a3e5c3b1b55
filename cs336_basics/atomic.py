"""Files written so that a reader, or a run resumed after a crash, sees the old file or the complete new one.

The new content goes to a hidden temporary file beside the target (same filesystem, so the rename is atomic),
is flushed to disk, then renamed over the target. A process killed mid-write leaves the target as it was and,
at worst, a temporary `.NAME.XXXX.tmp` that `is_leftover_temp` recognises (the run folder removes them at start).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

# Read once at import (os.umask can only be read by setting it): tempfile creates files 0600, and a checkpoint
# or results file should get the same permissions as any other file the user writes.
_UMASK = os.umask(0)
os.umask(_UMASK)

_TMP_SUFFIX = ".tmp"


def is_leftover_temp(path: Path) -> bool:
    """A temporary file of an atomic write that never completed (its writer was killed)."""
    return path.is_file() and path.name.startswith(".") and path.name.endswith(_TMP_SUFFIX)


def _fsync_dir(directory: Path) -> None:
    """Make the rename itself durable (POSIX); a no-op where directories cannot be opened (Windows)."""
    if os.name == "nt":
        return
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], Any]) -> Path:
    """Call `write(f)` on a temporary binary file beside `path`, then move it into place atomically.
    Any exception (KeyboardInterrupt included) removes the temporary file and leaves `path` as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=_TMP_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())  # data on disk before the rename makes it visible
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)
    return path


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    return atomic_write(path, lambda f: f.write(text.encode()))


def write_json_atomic(path: str | os.PathLike, data: Any) -> Path:
    return write_text_atomic(path, json.dumps(data, indent=2) + "\n")
