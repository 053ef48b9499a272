"""Shared fixtures for the flashgrad Python tests.

CPU tests run everywhere. Tests marked `gpu` need a CUDA device and a flashgrad built with its
CUDA backend; elsewhere they are skipped with the reason shown (pytest -rs)."""

from __future__ import annotations

import os

import pytest


def _cuda_skip_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device: torch.cuda.is_available() is False"
    import flashgrad
    if not flashgrad.build_info()["cuda"]:
        return "flashgrad was built without its CUDA backend (FLASHGRAD_CUDA=OFF or no nvcc)"
    return None


CUDA_SKIP_REASON = _cuda_skip_reason()


def pytest_collection_modifyitems(config, items):
    if CUDA_SKIP_REASON is None:
        return
    skip = pytest.mark.skip(reason=CUDA_SKIP_REASON)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng():
    """A fresh generator per test (new random inputs on every run; the seed is printed on failure)."""
    import torch
    seed = int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF
    print(f"random seed of this test: {seed}")  # shown by pytest when the test fails
    return torch.Generator().manual_seed(seed)
