# pytest setup for the openmla Python tests: GPU tests carry the `gpu` marker and skip
# themselves where torch sees no CUDA device.
import pytest
import torch


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped without one)")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device visible to torch")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def generator():
    """A fresh, seeded CPU generator per test: random inputs, reproducible failures."""
    return torch.Generator().manual_seed(20240611)
