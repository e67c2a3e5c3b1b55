import numpy as np
import pytest
import torch


def pytest_collection_modifyitems(config, items):
    """GPU tests run only where CUDA is present; elsewhere they are reported as skipped, never silently passed."""
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


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
