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
