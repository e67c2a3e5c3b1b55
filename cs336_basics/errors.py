"""User-facing errors: printed by the scripts as one line, without a traceback."""

import os
import sys


class ConfigError(ValueError):
    """A configuration, input file or environment that cannot be honoured; the message says what to do."""


class NotSupportedHere(ConfigError):
    """A valid request this machine cannot run (no CUDA, no FP8 tensor cores, no flash kernel, no torchao).
    The sweep records such a configuration as skipped rather than failed."""


class RunFolderError(RuntimeError):
    """The run folder cannot be written (disk full, permissions): the message names the file, the reason and what
    is still intact."""


def rank_prefix() -> str:
    """ "[rankN]: " in a process that torchrun started among several (torch prefixes uncaught tracebacks the same way),
    so that an error says which rank it came from; "" otherwise."""
    if "RANK" not in os.environ or os.environ.get("WORLD_SIZE", "1") == "1":
        return ""
    return f"[rank{os.environ['RANK']}]: "


def report_error(exc: BaseException, exit_code: int = 2) -> int:
    """Print a user-facing error as every script does (one line, no traceback); return the exit code to use."""
    print(f"{rank_prefix()}error: {exc}", file=sys.stderr)
    return exit_code
