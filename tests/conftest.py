"""Shared pytest set-up: the tests directory is importable from every folder (reference implementations and
test data live there), threads bounded, the shared fixtures, `gpu` tests skipped where no CUDA device is
visible, and `cpu_bf16` tests moved to the slow tier where the CPU has no native bf16."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from gpen_tune.tune.hardware import cpu_capabilities

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(max(1, min(2, torch.get_num_threads())))


@pytest.fixture
def home(tmp_path, monkeypatch):
    """An empty cache dir via GPEN_TUNE_HOME."""
    d = tmp_path / "cache"
    monkeypatch.setenv("GPEN_TUNE_HOME", str(d))
    return d


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module (`pytestmark = pytest.mark.usefixtures("one_thread")`): on a small shared
    CI machine two busy-waiting threads per process are many times slower than one (measured here: 0.1 s vs 0.7 s
    per tiny forward under load)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.hookimpl(tryfirst=True)          # before -m deselects: a cpu_bf16 test may become slow here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not cpu_capabilities().bf16_dot:    # bf16 is emulated on this CPU: many times slower than fp32
        for item in items:
            if "cpu_bf16" in item.keywords:
                item.add_marker(pytest.mark.slow)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
