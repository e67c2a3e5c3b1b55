"""Is this the file that was written? Checksums of checkpoint files, checked whenever one is read.

`torch.save` writes a zip archive and records a CRC-32 of every record (each tensor's bytes, the pickled
structure) in it, but `torch.load` does not check them: a flipped bit in a weight loads silently. `verify_zip`
recomputes every record's CRC-32 (in parallel threads over a memory map) and names the first one that differs.
Nothing extra is written: the checksums are the ones torch.save already computes (`save_with_checksums` makes sure
they are on). The tensors of a sharded (FSDP2) checkpoint are DCP files, which carry no checksum: their
CRC-32s are computed after they are written (`files_crc32`) and stored in the checkpoint.pt that names them.
"""

from __future__ import annotations

import mmap
import os
import struct
import zipfile
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

import torch

from cs336_basics.errors import ConfigError
from cs336_basics.files.atomic import atomic_write

_CHUNK = 1 << 22


class ChecksumError(ConfigError):
    """A file's bytes differ from the checksum written with them: it was damaged after it was written."""


def _damaged(path: Path, what: str) -> ChecksumError:
    return ChecksumError(
        f"{path} is damaged: {what} (a disk, copy or transfer error changed it after it was written). Restore it "
        "from a copy, or point at another checkpoint."
    )


def verify_zip(path: str | os.PathLike) -> bool:
    """Check every record of a torch.save zip file against its stored CRC-32. Returns False, checking nothing, when
    the file is no zip archive (a legacy torch file) or its writer stored no checksums (crc32 turned off in torch);
    raises ChecksumError naming the first damaged record.

    The records are checked in parallel threads over a memory map of the file (zlib.crc32 releases the GIL), so the
    check costs a fraction of torch.load's own read on a machine with several cores."""
    path = Path(path)
    if not zipfile.is_zipfile(path):
        return False
    try:
        with zipfile.ZipFile(path) as archive:
            records = [r for r in archive.infolist() if r.file_size]
            if any(r.compress_type != zipfile.ZIP_STORED for r in records):  # not torch.save's layout: read it all
                archive.testzip()
                return True
            with open(path, "rb") as f:
                spans = [(r, _data_offset(f, r)) for r in records]
    except zipfile.BadZipFile as exc:  # a damaged header or directory
        raise _damaged(path, str(exc)) from exc
    if all(r.CRC == 0 for r, _ in spans):  # written with torch's crc32 option off
        return False
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        view = memoryview(data)
        try:
            with ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 1)) as pool:
                crcs = list(pool.map(lambda span: _crc32(view, span[1], span[0].file_size), spans))
        finally:
            view.release()
    for (record, _), crc in zip(spans, crcs, strict=True):
        if crc != record.CRC:
            raise _damaged(path, f"the CRC-32 of its record {record.filename} differs from the one written with it")
    return True


def _data_offset(f: IO[bytes], record: zipfile.ZipInfo) -> int:
    """Where a stored record's bytes start: after its local header, whose name and extra field have their own
    lengths (torch pads the extra field to align tensors)."""
    f.seek(record.header_offset)
    header = f.read(30)
    if len(header) < 30 or header[:4] != b"PK\x03\x04":
        raise zipfile.BadZipFile(f"the local header of {record.filename} is damaged")
    name_length, extra_length = struct.unpack("<HH", header[26:30])
    return record.header_offset + 30 + name_length + extra_length


def _crc32(view: memoryview, start: int, size: int) -> int:
    crc = 0
    for offset in range(start, start + size, _CHUNK):
        crc = zlib.crc32(view[offset : min(offset + _CHUNK, start + size)], crc)
    return crc


def file_crc32(path: str | os.PathLike) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def files_crc32(folder: str | os.PathLike) -> dict[str, int]:
    """The CRC-32 of every file directly in `folder`, by name."""
    return {p.name: file_crc32(p) for p in sorted(Path(folder).iterdir()) if p.is_file()}


def verify_files(folder: str | os.PathLike, expected: dict[str, int]) -> None:
    """ChecksumError unless every file `expected` names is in `folder` with that CRC-32."""
    folder = Path(folder)
    for name, crc in expected.items():
        path = folder / name
        if not path.is_file():
            raise _damaged(folder, f"its file {name} is missing")
        if file_crc32(path) != crc:
            raise _damaged(path, "its CRC-32 differs from the one recorded when it was written")


def save_with_checksums(obj: Any, f: IO[bytes], crc32: bool = True) -> None:
    """torch.save with its CRC-32s on (its default, which a user may have turned off with set_crc32_options).
    `crc32=False`: without them, for measuring what they cost (lab/checkpoint_checksum.py)."""
    before = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(crc32)
    try:
        torch.save(obj, f)
    finally:
        torch.serialization.set_crc32_options(before)


def save_torch_file(path: str | os.PathLike, obj: Any) -> Path:
    """torch.save `obj` to `path` atomically (atomic.py), with its checksums."""
    return atomic_write(path, lambda f: save_with_checksums(obj, f))
