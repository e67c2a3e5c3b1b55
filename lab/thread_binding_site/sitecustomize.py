"""With this folder on PYTHONPATH, each training process binds its step's threads to one CPU (lab.thread_binding).
Python imports this module at start-up in every process; only training processes act on it, not torchrun's
launcher nor compile workers."""

import sys
from pathlib import Path

TRAINING = ("train_h100.py", "cs336_basics.sweep.worker")


def program(argv: list[str]) -> str:
    """The script or `-m` module a Python command line runs ("" for -c or none)."""
    args = iter(argv[1:])
    for arg in args:
        if arg in ("-m", "-X", "-W"):
            value = next(args, "")
            if arg == "-m":
                return value
        elif arg == "-c":
            return ""
        elif not arg.startswith("-"):
            return arg
    return ""


if program(sys.orig_argv).endswith(TRAINING):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for `lab`
    from lab.thread_binding import bind_when_autograd_starts

    bind_when_autograd_starts()
