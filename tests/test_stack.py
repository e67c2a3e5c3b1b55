"""One stack: the torch, triton and torchao that uv.lock installs are the ones the GPU tests and benchmarks ran on,
recorded in benchmarks/results/gpu-stack.json. A lock bump that no GPU has run fails here on the CPU (CI); a GPU that
runs another stack fails the GPU test. Triton matters most: a newer one miscompiled FP8 stores
(tests/test_fp8_store_guard.py)."""

from __future__ import annotations

import json
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "benchmarks" / "results" / "gpu-stack.json"
STACK = ("torch", "triton", "torchao")


def recorded() -> dict[str, str]:
    record = json.loads(RECORD.read_text())
    return {name: record[name] for name in STACK}


def public(version: str) -> str:
    """A version without its local label (2.11.0+cu130 -> 2.11.0): PyPI's versions carry none."""
    return version.split("+")[0]


def locked() -> dict[str, str]:
    packages = tomllib.loads((ROOT / "uv.lock").read_text())["package"]
    versions = {p["name"]: p["version"] for p in packages if p["name"] in STACK}
    assert set(versions) == set(STACK), f"uv.lock lacks {set(STACK) - set(versions)}"
    return versions


def test_the_lock_installs_the_stack_the_gpu_tests_ran():
    expected = {name: public(version) for name, version in recorded().items()}
    assert locked() == expected, (
        f"uv.lock installs {locked()}, but the GPU tests ran on {expected} ({RECORD.name}). Run the GPU tests on the "
        "new stack (python3 -m pytest -m gpu) before changing the lock, then update the record."
    )


def test_pyproject_pins_the_recorded_stack():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    pins = pyproject["tool"]["uv"]["constraint-dependencies"]
    assert sorted(pins) == sorted(f"{name}=={public(version)}" for name, version in recorded().items())


def test_this_environment_is_the_locked_one():
    # `uv run` syncs the environment to the lock, so a test run through it sees the pinned versions.
    installed = {}
    for name in STACK:
        try:
            installed[name] = public(metadata.version(name))
        except metadata.PackageNotFoundError:
            pytest.skip(f"{name} is not installed here (not a uv environment of this project)")
    assert installed == locked()


@pytest.mark.gpu
def test_gpu_runs_the_recorded_stack():
    import triton

    running = {"torch": torch.__version__, "triton": triton.__version__}
    try:
        import torchao

        running["torchao"] = torchao.__version__
    except ImportError:
        pytest.fail("torchao is not installed: the GPU tests run with it (carry its wheel)")
    assert running == recorded(), f"this GPU runs {running}; the record ({RECORD.name}) says {recorded()}"
