"""The host side of a CUDA generator call (gpen_tune.restore.staging): the crops into the staging buffer and the
results out of it, each in one call whatever the batch (their speed beside busy threads: benchmarks/staging_gil.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpen_tune.face import samples
from gpen_tune.restore.staging import gather_rows, split_rows


@pytest.fixture(scope="module")
def crops() -> np.ndarray:
    return samples.aligned_face_crops(64, 5)


def test_gather_rows_fills_the_buffer_in_place(crops):
    buffer = torch.zeros((8, 64, 64, 3), dtype=torch.uint8)
    shared = crops[1].copy()
    shared.setflags(write=False)                          # as a crop read from another process's shared memory
    strided = np.ascontiguousarray(np.repeat(crops[2], 2, axis=1))[:, ::2]     # a non-contiguous view
    rows = gather_rows([crops[0], shared, strided, crops[3]], buffer)
    assert rows.data_ptr() == buffer.data_ptr() and tuple(rows.shape) == (4, 64, 64, 3)
    assert np.array_equal(buffer[:4].numpy(), crops[:4])
    assert not buffer[4:].any()                           # rows past the batch untouched
    assert np.array_equal(gather_rows(crops[4:5], buffer).numpy(), crops[4:5])      # a batch of one


def test_gather_rows_refuses_crops_that_do_not_fill_its_rows(crops):
    buffer = torch.zeros((4, 64, 64, 3), dtype=torch.uint8)
    with pytest.raises(ValueError, match="do not fill rows"):
        gather_rows([crops[0], crops[1][:32]], buffer)


def test_split_rows_copies_out_of_the_reused_buffer(crops):
    buffer = torch.from_numpy(crops.copy())
    out = split_rows(buffer, 3)
    buffer.zero_()                                        # the next batch overwrites the buffer
    assert len(out) == 3 and all(np.array_equal(a, b) for a, b in zip(out, crops[:3], strict=True))
