"""Shared pytest set-up: the tests directory is importable from every folder (reference implementations and
test data live there), threads bounded, and `gpu` tests skipped where no CUDA device is visible."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(max(1, min(2, torch.get_num_threads())))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
