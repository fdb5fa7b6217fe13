"""Shared pytest set-up: the tests directory is importable from every folder (reference implementations and
test data live there), threads bounded (the cores shared among xdist workers), the shared fixtures, `gpu` tests
skipped where no CUDA device is visible, `cpu_bf16` tests moved to the slow tier where the CPU has no native bf16,
and a line per finished file when the run is spread over workers."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from gpen_tune.tune.hardware import cpu_capabilities

sys.path.insert(0, str(Path(__file__).parent))
from conftest_weights import TEST_FILES_ENV  # noqa: E402
from file_progress import FileProgress, in_workers  # noqa: E402

_TEST_FILES = pytest.StashKey[str]()

_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, torch.get_num_threads() // _WORKERS)))


@pytest.fixture
def home(tmp_path, monkeypatch):
    """An empty cache dir via GPEN_TUNE_HOME."""
    d = tmp_path / "cache"
    monkeypatch.setenv("GPEN_TUNE_HOME", str(d))
    return d


@pytest.fixture
def no_tf32():
    """Full fp32 convs and matmuls on CUDA for the test, PyTorch's settings restored afterwards. With TF32 (cuDNN's
    default for fp32 convs) batches of other sizes and graph replays pick other algorithms and differ by ~1e-3
    relative, which a synthetic generator turns into several grey levels."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


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


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    weights_files = sys.modules.get("conftest_weights")   # imported by the modules that need it, if any ran here
    if weights_files is not None:
        weights_files.remove_files()


def pytest_configure(config: pytest.Config) -> None:
    if in_workers(config):
        config.pluginmanager.register(FileProgress(config), "file_progress")
    if not hasattr(config, "workerinput"):     # the run's first process: one folder for every process's files
        folder = tempfile.mkdtemp(prefix="gpen-tune-tests-")
        os.environ[TEST_FILES_ENV] = folder    # inherited by the xdist workers and what they start (Ray, spawn)
        config.stash[_TEST_FILES] = folder


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = config.stash.get(_TEST_FILES, None)
    if folder is not None:                     # after every worker and child has ended
        shutil.rmtree(folder, ignore_errors=True)
