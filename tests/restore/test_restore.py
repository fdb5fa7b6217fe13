"""The one restorer (gpen_tune.restore): bucket policy, OOM splitting at the crop level, the non-finite guard."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from model_configs import SMALLEST

from gpen_tune.face import samples
from gpen_tune.load import load_model
from gpen_tune.model.configs import GPENConfig
from gpen_tune.pipeline import EnhanceSettings, Pipeline
from gpen_tune.restore.buckets import BUCKETS, bucket_floor, default_batch_size, split_sizes, take
from gpen_tune.restore.restorer import Restorer, build_restorer
from gpen_tune.tune import TuneConfig

TINY = GPENConfig(64, narrow=0.25)


@pytest.fixture(scope="module")
def model():
    return load_model("synthetic", model=TINY)


def nan_generator(config: GPENConfig = TINY):
    """A generator whose weights turned NaN in memory (a NaN checkpoint file is refused at load, see
    tests/weights/test_bad_input_weights.py): what the restorer's guard is for."""
    net = load_model("synthetic", model=config)
    with torch.no_grad():
        for p in net.parameters():
            p.fill_(float("nan"))
    return net


def test_bucket_policy():
    assert default_batch_size("cuda") == default_batch_size(torch.device("cuda", 0)) == 32
    assert default_batch_size("cpu") == default_batch_size(torch.device("cpu")) == 1
    assert [take(n, 32) for n in (1, 3, 7, 29, 40)] == [1, 2, 4, 16, 32]        # bucket sizes, no padding
    assert [take(n, 32, one_shape=True) for n in (1, 3, 29, 40)] == [1, 3, 29, 32]   # padded forward: any count
    assert split_sizes(29) == [16, 8, 4, 1] and split_sizes(5, limit=2) == [2, 2, 1]
    assert bucket_floor(0) == 0 and bucket_floor(33) == 32 and bucket_floor(7, limit=3) == 2
    # the starting limit is what the caller asked (a serial batch runs as one call); take gives buckets below it
    assert Restorer(lambda x: x, max_batch=5).limit == 5 and Restorer(lambda x: x).limit == BUCKETS[-1]
    assert Restorer(lambda x: x, max_batch=5).take(7) == 4
    r = Restorer(lambda x: x, max_batch=16)
    assert r.take(29) == 16 and r.take(13) == 8 and r.take(13, limit=4) == 4
    r.one_shape = True
    assert r.take(13) == 13 and r.take(40) == 16


def test_oom_split_at_the_crop_level_lowers_the_limit_and_keeps_the_results(model):
    """A forward that runs out of memory above 2 faces: the batch is split, the results equal an unsplit run, the
    limit stays at 2 (a bucket) for later batches, and every split is recorded."""
    crops = list(samples.aligned_face_crops(64, 6))
    seen: list[int] = []

    def small_device(x: torch.Tensor) -> torch.Tensor:
        seen.append(x.shape[0])
        if x.shape[0] > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
        return model(x)

    want = Restorer(model, max_batch=1).restore_crops(crops)
    restorer = Restorer(small_device, max_batch=8)
    got = restorer.restore_crops(crops)
    assert seen == [6, 2, 2, 2]                     # 6 fails: the limit drops to the bucket below 6 / 2
    assert restorer.limit == 2 and restorer.times.oom_splits == 1
    assert np.abs(got.astype(int) - want.astype(int)).max() <= 1
    assert restorer.fallbacks == ["out of memory at batch 6: running batches of at most 2 from now on"]
    seen.clear()
    assert np.array_equal(restorer.restore_crops(crops[:4]), got[:4]) and seen == [2, 2]


def test_nan_weights_keep_the_input_crops_and_count_them():
    """A checkpoint full of NaN: every face comes back as its input crop (not a black square), counted once per
    face, with one fallback line, through the restorer the library's Pipeline builds."""
    net = nan_generator()
    enhancer = Pipeline(EnhanceSettings(device="cpu", batch_size=4), model=net)
    crops = samples.aligned_face_crops(64, 6)
    out = enhancer.restorer.restore_crops(list(crops))
    assert np.array_equal(out, np.stack(crops))
    assert enhancer.restorer.nonfinite_faces == 6
    assert len(enhancer.restorer.fallbacks) == 1 and "keep their input crop" in enhancer.restorer.fallbacks[0]
    x = torch.from_numpy(np.stack(crops[:2])).permute(0, 3, 1, 2).float() / 127.5 - 1
    assert torch.equal(enhancer.restorer(x), x)     # the tensor-level call keeps the input too
    assert enhancer.restorer.nonfinite_faces == 8


def test_nan_weights_with_amp_rerun_in_fp32_first():
    """With --amp the batch is re-run in fp32 first; still non-finite there, the input crop is kept (on the
    smallest generator: bf16 is emulated, slowly, on CPUs without bf16 instructions)."""
    net = nan_generator(SMALLEST)
    restorer = build_restorer(net, TuneConfig(amp="bf16"), device="cpu", max_batch=4)
    crops = list(samples.aligned_face_crops(SMALLEST.size, 3))
    pending = restorer.submit(crops)
    assert pending.done()                           # inline on the CPU
    assert np.array_equal(np.stack(pending.result()), np.stack(crops))
    assert restorer.fp32_reruns == 1 and restorer.nonfinite_faces == 3
    assert any("still non-finite" in f for f in restorer.fallbacks)


def test_one_bad_face_in_a_batch_is_the_only_one_replaced(model):
    """Per-face flags: only the face whose output is non-finite gets its input back; its neighbours are restored."""
    crops = list(samples.aligned_face_crops(64, 3))

    def second_face_breaks(x: torch.Tensor) -> torch.Tensor:
        y = model(x)
        y[1, 0, 5, 5] = float("nan")
        return y

    want = Restorer(model).restore_crops(crops)
    restorer = Restorer(second_face_breaks)
    got = restorer.restore_crops(crops)
    assert np.array_equal(got[1], crops[1]) and not np.array_equal(want[1], crops[1])
    assert np.array_equal(got[[0, 2]], want[[0, 2]])
    assert restorer.nonfinite_faces == 1
