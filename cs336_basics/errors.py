"""User-facing errors: every program prints them as one line, without a traceback, and exits with the README's code.

Exit codes: 0 done; 1 the work failed on its way (training diverged, an output could not be written: the message says
what is intact); 2 a setting or input that cannot be used (found before the work started); 130 / 143 SIGINT / SIGTERM.
"""

import errno
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class ConfigError(ValueError):
    """A configuration, input file or environment that cannot be honoured; the message says what to do."""

    every_rank = False  # refused alike by every rank of a torchrun launch (alike_on_every_rank): rank 0 reports it


class NotSupportedHere(ConfigError):
    """A valid request this machine cannot run (no CUDA, no FP8 tensor cores, no flash kernel, no torchao).
    The sweep records such a configuration as skipped rather than failed."""


class WorkFailed(RuntimeError):
    """The work started and could not finish (exit code 1); the message says what is intact."""


class RunFolderError(WorkFailed):
    """The run folder cannot be written (disk full, permissions): the message names the file, the reason and what
    is still intact."""


# What an OSError means for the user, by errno (the rest keep the system's own words).
_OS_REASONS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is used up",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.ENAMETOOLONG: "a name in the path is longer than the file system allows",
    errno.ENOTDIR: "a part of the path is a file, not a folder",
    errno.EEXIST: "a file of that name is in the way",
    errno.EISDIR: "it is a folder, not a file",
    errno.ENOENT: "no such file or folder",
}


# What torch.save's zip writer raises when the file's write fails: "[enforce fail at inline_container.cc:672] .
# unexpected pos 1497792 vs 1497684" (a write to a Python file that raised), "... PytorchStreamWriter failed writing
# file data/3: file write failed" (or "... central directory ...", or with no reason: "... data/3."). It keeps no errno.
_TORCH_WRITER_FAILED = ("PytorchStreamWriter failed", "unexpected pos", "file write failed")


def os_reason(exc: BaseException) -> str:
    """An OSError (or torch's opaque stream-writer error, which a full disk causes) in a few plain words."""
    text = str(exc).strip()
    if isinstance(exc, OSError) and exc.errno in _OS_REASONS:
        return _OS_REASONS[exc.errno]
    if any(marker in text for marker in _TORCH_WRITER_FAILED):
        if isinstance(exc.__context__, OSError):  # the Python file's error, which torch's writer raised over
            return os_reason(exc.__context__)
        # Without it, the cause that fills a disk: a full disk (another writer, or this run's own checkpoints).
        return f"the disk is full (torch's writer: {text.splitlines()[-1].split('] . ')[-1]})"
    return text.splitlines()[-1] if text else type(exc).__name__


def io_error(exc: BaseException, path: os.PathLike | str, intact: str) -> RunFolderError:
    """A one-line error for a failed write of `path` during the work, saying what is still intact."""
    return RunFolderError(f"could not write {path}: {os_reason(exc)}. {intact}")


@contextmanager
def writing(path: os.PathLike | str, intact: str) -> Iterator[None]:
    """Write `path` in the block; an OSError there becomes io_error's one line, saying what is intact."""
    try:
        yield
    except OSError as exc:
        raise io_error(exc, path, intact) from exc


@contextmanager
def alike_on_every_rank() -> Iterator[None]:
    """Checks that every rank of a torchrun launch makes alike (of the flags, of the files the ranks share): a refusal
    in the block is reported by rank 0 alone (run_program), not once per rank."""
    try:
        yield
    except ConfigError as exc:
        exc.every_rank = True
        raise


# How long a rank but 0 waits, on a refusal every rank makes alike, for torchrun to stop it (SIGTERM) once rank 0 has
# reported the refusal and exited: exiting first would have torchrun stop rank 0, perhaps before it printed. A rank
# still running after it (rank 0 did not refuse: another GPU, say) reports the refusal itself.
RANK_0_REPORTS_S = 30.0


def rank_prefix() -> str:
    """ "[rankN]: " in a process that torchrun started among several (torch prefixes uncaught tracebacks the same way),
    so that an error says which rank it came from; "" otherwise."""
    if "RANK" not in os.environ or os.environ.get("WORLD_SIZE", "1") == "1":
        return ""
    return f"[rank{os.environ['RANK']}]: "


def report_error(exc: BaseException | str, exit_code: int = 2) -> int:
    """Print a user-facing error as every script does (one line, no traceback); return the exit code to use."""
    print(f"{rank_prefix()}error: {exc}", file=sys.stderr)
    return exit_code


def _another_rank() -> bool:
    """A rank other than 0 of a torchrun launch: rank 0 speaks for the run."""
    return bool(rank_prefix()) and os.environ["RANK"] != "0"


def run_program(body: Callable[[], int], after_interrupt: Callable[[], str] | None = None) -> int:
    """Run a program's work with the one error path every program shares: a ConfigError is exit code 2, a WorkFailed
    1, and an OSError no check foresaw (a file that could not be read or written) 1, each one line. A stop signal
    (Ctrl-C; SIGTERM where the work holds signals.terminate_raises) is one line too, what it said followed by what
    `after_interrupt` says is intact, with exit code 130 or 143."""
    try:
        return body()
    except KeyboardInterrupt as exc:
        said = str(exc).rstrip(".") or "interrupted"
        code = getattr(exc, "exit_code", 130)  # signals.Interrupted knows its signal; a plain Ctrl-C is SIGINT
        if _another_rank():
            # torchrun stops every rank when one ends (its error, a refusal, or the user's stop): rank 0's lines say
            # what is intact and how to go on, which advice here could only contradict.
            print(f"\n{rank_prefix()}{said}; rank 0's lines say what is intact", file=sys.stderr)
            return code
        print(f"\n{rank_prefix()}{said}" + (f". {after_interrupt()}" if after_interrupt else ""), file=sys.stderr)
        return code
    except ConfigError as exc:
        if exc.every_rank and _another_rank():
            time.sleep(RANK_0_REPORTS_S)
        return report_error(exc)
    except WorkFailed as exc:
        return report_error(exc, exit_code=1)
    except OSError as exc:
        where = f" {exc.filename}" if getattr(exc, "filename", None) else ""
        return report_error(f"could not read or write{where}: {os_reason(exc)}.", exit_code=1)
