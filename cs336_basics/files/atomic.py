"""Files written so that a reader, or a run resumed after a crash, sees the old file or the complete new one.

The new content goes to a hidden temporary file beside the target (same filesystem, so the rename is atomic),
is flushed to disk, then renamed over the target. A rename replaces a symbolic link at the target rather than writing
through it. A process killed mid-write leaves the target as it was and, at worst, a temporary file.

Every temporary file or folder this program makes is named by `temp_prefix`: `.cs336-tmp-<host>-<pid>-<name>-...`.
The mark tells the program's temporaries from the user's own hidden files (a user's `.notes.tmp` is never touched);
the host and PID tell a temporary whose writer was killed (stale) from one still being written by another run, so
that `remove_stale_temps` never deletes a live run's file, on this machine or on another sharing the disk.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

# Read once at import (os.umask can only be read by setting it): tempfile creates files 0600, and a checkpoint
# or results file should get the same permissions as any other file the user writes.
_UMASK = os.umask(0)
os.umask(_UMASK)

TEMP_PREFIX = ".cs336-tmp-"
# A short tag of this machine: a PID says whether a writer is alive only on the machine that ran it.
HOST_TAG = f"{zlib.crc32(socket.gethostname().encode()):08x}"
_TEMP_NAME = re.compile(rf"^{re.escape(TEMP_PREFIX)}(?P<host>[0-9a-f]{{8}})-(?P<pid>[0-9]+)-")


def temp_prefix(name: str, pid: int | None = None) -> str:
    """The start of the name of a temporary file or folder for `name`, made by process `pid` (this one by default)."""
    return f"{TEMP_PREFIX}{HOST_TAG}-{os.getpid() if pid is None else pid}-{name}-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def _is_stale_temp(path: Path) -> bool:
    """A temporary file or folder of this program whose writer, on this machine, is no longer running."""
    match = _TEMP_NAME.match(path.name)
    return match is not None and match["host"] == HOST_TAG and not _alive(int(match["pid"]))


def remove_stale_temps(folder: Path) -> list[Path]:
    """Delete the stale temporaries directly in `folder` (not below it: each writer cleans where it writes)."""
    try:
        stale = [p for p in Path(folder).iterdir() if _is_stale_temp(p)]
    except FileNotFoundError:
        return []
    for p in stale:
        with contextlib.suppress(FileNotFoundError):  # another run removed it first
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    return stale


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
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path.name), dir=path.parent)
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
