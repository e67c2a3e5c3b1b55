"""User-facing errors: raised before any training starts, printed by the scripts without a traceback."""

import sys


class ConfigError(ValueError):
    """A configuration, input file or environment that cannot be honoured; the message says what to do."""


def report_error(exc: BaseException, exit_code: int = 2) -> int:
    """Print a user-facing error as every script does (one line, no traceback); return the exit code to use."""
    print(f"error: {exc}", file=sys.stderr)
    return exit_code
