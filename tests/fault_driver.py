"""train_h100.py with its checkpoint writes made observable and slow, for the fault-injection test.

Each checkpoint write puts the first half of its bytes in the file, appends a line to the file named by
$FAULT_MARKERS, pauses, then writes the rest: a signal sent when the marker appears lands in the middle of a write.
Nothing else changes: the training itself is train_h100.main's.
"""

import io
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import train_h100  # noqa: E402

_real_save = torch.save
PAUSE_S = 0.15


def observable_slow_save(obj, f, *args, **kwargs):
    buffer = io.BytesIO()
    _real_save(obj, buffer, *args, **kwargs)
    data = buffer.getvalue()
    f.write(data[: len(data) // 2])
    f.flush()
    with open(os.environ["FAULT_MARKERS"], "a") as markers:
        markers.write("saving\n")
    time.sleep(PAUSE_S)
    f.write(data[len(data) // 2 :])


if __name__ == "__main__":
    torch.save = observable_slow_save
    sys.exit(train_h100.main(sys.argv[1:]))
