"""Paths a program will write, checked before the work starts: a run folder, a results file, an exported checkpoint.

A path that cannot be written (a file where a folder should be, a read-only file system, a name longer than the file
system allows) is a ConfigError naming the flag now, rather than an OSError after minutes of work. Writability is
probed with a temporary file (permission bits do not tell: root may write anywhere, except on a read-only mount), which
is removed at once; nothing else is created.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from cs336_basics.errors import ConfigError, os_reason


def _existing_ancestor(path: Path) -> Path:
    for parent in path.absolute().parents:
        if parent.exists():
            return parent
    return Path(path.absolute().anchor)


def _creatable(path: Path) -> str | None:
    """What stops `path` (which does not exist) from being created, or None."""
    ancestor = _existing_ancestor(path)
    if not ancestor.is_dir():
        return f"{ancestor} is a file, not a folder"
    name_max = os.pathconf(ancestor, "PC_NAME_MAX")
    for part in path.absolute().relative_to(ancestor).parts:
        if len(os.fsencode(part)) > name_max:
            return f"a name in it is {len(os.fsencode(part))} bytes long; the file system allows {name_max}"
    return _unwritable(ancestor)


def _unwritable(folder: Path) -> str | None:
    try:
        with tempfile.TemporaryFile(dir=folder):
            return None
    except OSError as exc:
        return f"{folder} cannot be written: {os_reason(exc)}"


def _problem(path: Path, want_dir: bool) -> str | None:
    """What stops this program from writing `path` (a folder to write into, or a file), or None."""
    try:
        path.stat()
    except FileNotFoundError:
        return _creatable(path)
    except OSError as exc:  # a name too long, a file used as a folder, no permission to look
        return os_reason(exc)
    if want_dir and not path.is_dir():
        return "it is a file, not a folder"
    if not want_dir and path.is_dir():
        return "it is a folder; name a file"
    return _unwritable(path if want_dir else path.parent)  # a file is replaced from its folder


def check_output_path(path: str | os.PathLike, flag: str, *, folder: bool, replace: bool = True) -> Path:
    """`path` is a folder this program can create or write into (`folder`), or a file it can write (atomically: a
    temporary file beside it, renamed); else a ConfigError naming `flag`. Without `replace`, a file that is there
    already is refused (a program writing a weights file a run may need, say), with --overwrite to replace it."""
    path = Path(path).expanduser()
    if not replace and not folder and path.is_file():
        raise ConfigError(f"{flag} {path} exists already; pass --overwrite to replace it, or choose another {flag}.")
    problem = _problem(path, want_dir=folder)
    if problem:
        shown = str(path) if len(str(path)) <= 100 else f"{str(path)[:60]}...{str(path)[-30:]}"
        raise ConfigError(f"{flag} {shown} cannot be used: {problem}. Choose another {flag}.")
    return path
