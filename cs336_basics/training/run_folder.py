"""The run folder: one run at a time, nothing of an earlier run lost by accident, nothing left half-written.

A run folder holds config.json, metrics.jsonl, loss_curve.png, checkpoint.pt, result.json and tokenizer/ (and, for
an FSDP2 run, checkpoint.shards/, the tensors of its sharded checkpoint). Rules:
- one process at a time: an exclusive lock (`.lock`, holding the owner's PID and host) for the whole run; the kernel
  drops it when the process ends, however it ends, so a killed run never leaves a stale lock;
- under torchrun, one folder for every rank: rank 0 holds the lock and every rank writes into the folder (the shards
  of a sharded checkpoint) and reads from it (--resume), so on several nodes it must be on a filesystem they share, at
  the same path. Each rank checks that it sees rank 0's lock there before anything else is read or written;
- a new run starts only in a folder without an earlier run's files (the user's other files are left alone), or with
  --overwrite (which deletes the earlier run's files);
- --resume needs the folder and its checkpoint, and everything is checked (the checkpoint reads, its model fits
  the config, there is something left to train) before a single file is written;
- temporary files of writes that a kill interrupted are removed at start, and so are shard folders that checkpoint.pt
  does not name (an older checkpoint's, or a write cut short). Only the program's own temporaries (atomic.py's names)
  whose writer is dead, and only where the run writes them (the folder and its tokenizer/): the folder may hold the
  user's files too;
- its files are its own: a .lock or run file that is a symbolic link is refused, since the run would write (or
  delete) through it into whatever it points to. The folder itself may be a link (a run kept on another disk).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import socket
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cs336_basics.config import LORA_IDENTITY_FIELDS, MODEL_IDENTITY_FIELDS, RunConfig
from cs336_basics.errors import ConfigError
from cs336_basics.files.atomic import remove_stale_temps
from cs336_basics.files.output_paths import check_output_path
from cs336_basics.parallel.world import World, broadcast_text, refuse_together
from cs336_basics.training.checkpoint import CHECKPOINT_NAME, SHARDS_DIR, read_checkpoint, remove_stale_shards

LOCK_NAME = ".lock"
RUN_FILES = ("config.json", "metrics.jsonl", "loss_curve.png", CHECKPOINT_NAME, SHARDS_DIR, "result.json", "tokenizer")


_REPLACE_LINK = (
    "Put the file itself in its place, or remove the link, and run again; to keep a run on another disk, make "
    "--out_dir itself the link."
)


def _holder(lock_fd: int) -> str:
    """What a lock file says of the run that holds it ("<PID> on <host>")."""
    return os.pread(lock_fd, 256, 0).decode(errors="replace").strip() or "unknown"


def _in_use(path: Path, holder: str) -> str:
    return f"{path} is in use by another run (PID {holder}); wait for it to finish, or choose another --out_dir."


def _not_own(path: Path, fix: str) -> str:
    """Why a lock or run file that is not a plain file of the folder's own is refused."""
    if path.is_symlink():
        return f"{path} is a symbolic link (to {os.readlink(path)}): the run would write or delete through it. {fix}"
    return f"{path} is not a regular file, so it cannot be the run's lock. {fix}"


class RunFolder:
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._lock_fd: int | None = None

    config_path = property(lambda self: self.path / "config.json")
    metrics_path = property(lambda self: self.path / "metrics.jsonl")
    plot_path = property(lambda self: self.path / "loss_curve.png")
    checkpoint_path = property(lambda self: self.path / CHECKPOINT_NAME)
    result_path = property(lambda self: self.path / "result.json")
    tokenizer_path = property(lambda self: self.path / "tokenizer")

    def check_usable(self, resume: bool, overwrite: bool = False) -> None:
        """Cheap checks, before any heavy work: the path can be a run folder, no other run is using it, --resume has
        a run to resume, and a new run is not started over an earlier one without --overwrite. (The lock and
        start_fresh check the last two again, authoritatively, once the folder is locked.)"""
        check_output_path(self.path, "--out_dir", folder=True)
        if (holder := self._held_by_another()) is not None:
            raise ConfigError(_in_use(self.path, holder))
        if not resume:
            self._refuse_an_earlier_run(overwrite)
        elif not self.checkpoint_path.is_file():
            what = "has no checkpoint to resume from" if self.path.is_dir() else "does not exist"
            hint = (
                "; it was stopped before its first checkpoint: start it again with --overwrite"
                if self.config_path.is_file()
                else ""
            )
            raise ConfigError(
                f"--resume was given but {self.path} {what} ({self.checkpoint_path} is missing){hint}. Start without "
                "--resume, or point --out_dir at the run to continue."
            )

    @contextlib.contextmanager
    def locked(self) -> Iterator[RunFolder]:
        """Hold the folder's lock (creating the folder if needed) for the duration; refuse if another run holds
        it, or if the lock or a run file is not the folder's own. Stale temporary files are removed once the lock
        is ours."""
        lock = self.path / LOCK_NAME
        remove_lock = f"Remove it (rm {lock}) and run again."
        created = not self.path.exists()
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EISDIR):
                raise ConfigError(_not_own(lock, remove_lock)) from None
            raise ConfigError(f"cannot use {self.path} as a run folder ({exc}); choose a writable --out_dir.") from exc
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise ConfigError(_not_own(lock, remove_lock))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            owner = _holder(fd)
            os.close(fd)
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise ConfigError(f"cannot lock the run folder {self.path} ({exc}).") from exc
            raise ConfigError(_in_use(self.path, owner)) from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} on {socket.gethostname()}\n".encode(), 0)
            os.fsync(fd)  # a network filesystem shows the content to other nodes (check_shared) once it is flushed
        except OSError as exc:
            os.close(fd)
            raise ConfigError(
                f"cannot write to the run folder {self.path} ({exc}); choose a writable --out_dir."
            ) from exc
        self._lock_fd = fd
        try:
            links = [self.path / name for name in RUN_FILES if (self.path / name).is_symlink()]
            if links:
                raise ConfigError(_not_own(links[0], _REPLACE_LINK))
            self.remove_leftover_temps()
            yield self
        finally:
            self._lock_fd = None
            # A run refused before it wrote anything leaves no trace: its lock goes (removed while still held, so
            # that no other run takes the lock of a file about to vanish), and so does the folder if it created it.
            with contextlib.suppress(OSError):  # another process's file in it meanwhile: then it stays
                if [p.name for p in self.path.iterdir()] == [LOCK_NAME]:
                    lock.unlink()
                    if created:
                        self.path.rmdir()
            os.close(fd)  # closing the descriptor releases the flock

    def lock_owner(self) -> str | None:
        """What the folder's lock says of its holder ("<PID> on <host>"), or None where there is no lock to read."""
        try:
            return (self.path / LOCK_NAME).read_text(errors="replace").strip()
        except OSError:
            return None

    def check_shared(self, world: World) -> None:
        """Under torchrun, after rank 0 took the lock: every rank sees that lock in its --out_dir, so the ranks share
        one folder. Otherwise (a folder on each node's own disk) a sharded checkpoint would be scattered over the
        nodes, and a resume would read a checkpoint some nodes lack. Every rank stops if any does not see it."""
        if not world.launched:
            return
        holder = broadcast_text((self.lock_owner() or "") if world.is_main else "")
        refusal = None
        if self.lock_owner() != holder:
            refusal = ConfigError(
                f"--out_dir {self.path} on this host ({socket.gethostname()}) is not the run folder rank 0 holds: "
                f"its lock (held by PID {holder}) is not there. Every rank writes into the run folder and reads "
                "from it: on several nodes, put --out_dir on a filesystem they all mount, at the same path."
            )
        refuse_together(
            refusal,
            world,
            f"another rank does not see the run folder {self.path} (its message says which); on several nodes, put "
            "--out_dir on a filesystem they all mount, at the same path.",
        )

    def remove_leftover_temps(self) -> list[Path]:
        """Delete the temporaries of writes that a killed process never finished, where the run writes them."""
        leftovers = remove_stale_temps(self.path) + remove_stale_temps(self.tokenizer_path)
        return leftovers + remove_stale_shards(self.path)

    def existing_run_files(self) -> list[str]:
        return [name for name in RUN_FILES if (self.path / name).exists()]

    def _refuse_an_earlier_run(self, overwrite: bool) -> list[str]:
        """The files of an earlier run in the folder; a ConfigError saying what to do if there are any and not
        `overwrite`."""
        existing = self.existing_run_files()
        if existing and not overwrite:
            raise ConfigError(
                f"{self.path} already holds a run ({', '.join(existing)}). Pass --resume to continue it, --overwrite "
                "to delete it and start again, or choose another --out_dir."
            )
        return existing

    def _held_by_another(self) -> str | None:
        """What the folder's lock says of its holder if another process holds it now, else None. Creates nothing."""
        try:  # never waiting: a FIFO in the lock's place would block a plain open
            fd = os.open(self.path / LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:  # no lock file, or not the folder's own (locked() refuses it)
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return _holder(fd)
        finally:
            os.close(fd)  # releases the probe's own shared lock, if it got one
        return None

    def start_fresh(self, overwrite: bool) -> list[str]:
        """Make the folder ready for a new run: refuse if an earlier run is there, unless `overwrite`, which
        deletes its files. Returns what was deleted."""
        existing = self._refuse_an_earlier_run(overwrite)
        for name in existing:
            target = self.path / name
            shutil.rmtree(target) if target.is_dir() else target.unlink()
        return existing

    def read_resume_state(self, config: RunConfig, mmap: bool = False) -> dict[str, Any]:
        """The checkpoint to resume from, checked against `config`: it reads, and its model is the one `config`
        builds (the attention kernel and activation checkpointing may change; the shape and function may not).
        `mmap`: see read_checkpoint."""
        ckpt = read_checkpoint(self.checkpoint_path, mmap=mmap)
        saved_config = RunConfig.from_dict(ckpt["config"])
        if saved_config.train.seed != config.train.seed:
            # The seed chose the initial weights and the data order; a resume continues both from the checkpoint, so
            # another seed would change nothing but what config.json says the run was.
            raise ConfigError(
                f"--resume: the run in {self.path} was started with --seed {saved_config.train.seed}, not "
                f"{config.train.seed}; its weights and data order continue from the checkpoint whatever the seed. "
                "Resume without --seed, or start a new run with it in another --out_dir."
            )
        changed = [
            f"{name} {getattr(saved, name)} -> {getattr(now, name)}"
            for saved, now, names in (
                (saved_config.model, config.model, MODEL_IDENTITY_FIELDS),
                (saved_config.finetune, config.finetune, LORA_IDENTITY_FIELDS),
            )
            for name in names
            if getattr(saved, name) != getattr(now, name)
        ]
        if changed:
            raise ConfigError(
                f"--resume: the checkpoint {self.checkpoint_path} was trained with another model "
                f"({', '.join(changed)}). Resume without these flags (the run folder's config.json has the run's "
                "settings), or start a new run in another --out_dir."
            )
        return ckpt
