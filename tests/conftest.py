import os
import subprocess
import sys

# MKL's results can depend on its operands' memory alignment unless its conditional numerical reproducibility mode
# fixes one code path, so two runs of one CPU matrix product may differ in the last bit (with torch 2.11's MKL the
# compiled CPU resume test failed in about half its runs; with this set, in none of 8). The tests that hold a resumed
# run to the uninterrupted one bit for bit need it, set before the first MKL call. A user's CPU run can do the same
# (README, "Run folders").
os.environ.setdefault("MKL_CBWR", "COMPATIBLE")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """GPU tests run only where CUDA is present; elsewhere they are reported as skipped, never silently passed."""
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _fresh_compiler():
    """Each test compiles in a fresh dynamo, as each program does (one model per process; the measuring programs
    reset between models: measurement.release_memory). Left to accumulate, the graphs that dynamo traced through an
    FP8 autograd.Function for one model's modules (a LoRA base's, say) broke its trace of the same Function for the
    next model's (an assertion inside torch 2.11's autograd.Function tracing, seen on an H200 when the LoRA GPU
    tests ran before the train CLI's in one process)."""
    yield
    torch._dynamo.reset()


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    """Accelerate keeps one state per process, set by its first Accelerator (device included), as a program has one;
    the tests convert models on the CPU and on a GPU in one process, so each starts with none."""
    yield
    state = sys.modules.get("accelerate.state")
    if state is not None:
        state.AcceleratorState._reset_state(reset_partial_state=True)


@pytest.fixture
def token_files(tmp_path):
    """CLI flags for a small learnable token stream (ids < 64: a repeating pattern with 10% noise)."""
    rng = np.random.default_rng(0)
    pattern = np.tile(np.arange(64, dtype=np.uint16), 200)
    noise = rng.integers(0, 64, size=pattern.size, dtype=np.uint16)
    tokens = np.where(rng.random(pattern.size) < 0.1, noise, pattern).astype(np.uint16)
    train, val = tmp_path / "train.npy", tmp_path / "val.npy"
    np.save(train, tokens[:10000])
    np.save(val, tokens[10000:])
    return ["--train_data", str(train), "--val_data", str(val)]


@pytest.fixture
def dead_pid():
    """The PID of a process that has ended, as a killed writer leaves in the names of its temporary files."""
    proc = subprocess.Popen([sys.executable, "-c", ""])
    proc.wait()
    return proc.pid
