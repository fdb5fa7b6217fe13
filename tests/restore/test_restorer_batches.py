"""The Restorer's batches (gpen_tune.restore): OOM splitting of a submitted batch, the uint8 conversion, the
one-shape padding of a compiled forward, and on CUDA the pinned double buffer and the deferred non-finite guard."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpen_tune.face import samples
from gpen_tune.load import load_model
from gpen_tune.model.configs import GPENConfig
from gpen_tune.restore.restorer import Restorer, build_restorer

TOLERANCE = 2          # grey levels between batchings of the same faces


@pytest.fixture(scope="module")
def model():
    return load_model("synthetic", model=GPENConfig(64, narrow=0.25))


def test_oom_splits_batch_and_keeps_the_limit():
    """An injected CUDA allocation failure above 2 faces: the batch is split, retried, and 2 is kept."""
    model = load_model("synthetic", model=GPENConfig(32, narrow=0.25))
    crops = list(samples.aligned_face_crops(32, 8))
    sizes: list[int] = []

    def small_gpu(x: torch.Tensor) -> torch.Tensor:
        sizes.append(x.shape[0])
        if x.shape[0] > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
        return model(x)

    restorer = Restorer(small_gpu, device="cpu", size=32, max_batch=8)
    got = restorer.submit(crops).result()
    assert sizes == [8, 4, 2, 2, 2, 2]              # 8 fails, 4 fails, then chunks of the kept limit
    assert restorer.limit == 2 and restorer.times.oom_splits == 2
    reference = Restorer(model, device="cpu", size=32, max_batch=2).restore_crops(crops)
    for a, b in zip(got, reference, strict=True):
        assert np.abs(a.astype(int) - b.astype(int)).max() <= 1
    sizes.clear()
    again = restorer.restore_crops(crops)                      # later work respects the kept limit: no new failure
    assert sizes == [2, 2, 2, 2] and restorer.times.oom_splits == 2
    assert len(again) == 8
    with pytest.raises(ValueError):                # a non-OOM error is not split, it propagates
        Restorer(lambda x: (_ for _ in ()).throw(ValueError("bad")), device="cpu", max_batch=4).submit(crops[:4])


def test_uint8_conversion_is_the_serial_one(model):
    crops = list(samples.aligned_face_crops(64, 4))
    want = build_restorer(model, device="cpu", max_batch=4).restore_crops(crops)
    got = Restorer(model, device="cpu", size=64, max_batch=4).submit(crops).result()
    assert np.array_equal(np.stack(got), want)


@pytest.mark.gpu
def test_cuda_pinned_path_equals_serial_restore():
    cuda_model = load_model("synthetic", model=GPENConfig(64, narrow=0.25), device="cuda")
    crops = list(samples.aligned_face_crops(64, 8))
    want = build_restorer(cuda_model, device="cuda", max_batch=8).restore_crops(crops).astype(int)
    restorer = Restorer(cuda_model, device="cuda", size=64, max_batch=8)
    first = restorer.submit(crops)
    second = restorer.submit(crops[4:])              # two batches in flight on the pinned double buffer
    # different batch sizes pick different cuDNN algorithms (and TF32 is on for fp32 convs by default): the
    # pinned path must match within the pipeline's tolerance, not bit for bit. The two batches hold different
    # faces, so a buffer handed to the wrong batch is far outside it.
    assert np.abs(want[:4] - want[4:]).max() > 10 * TOLERANCE
    assert np.abs(np.stack(first.result()).astype(int) - want).max() <= TOLERANCE
    assert np.abs(np.stack(second.result()).astype(int) - want[4:]).max() <= TOLERANCE
    assert restorer.times.generator_s > 0
    from gpen_tune.face.paste import DeviceFace, paste_faces_device

    image = samples.astronaut()
    face = DeviceFace(first.device_out[0], np.array([[2.0, 0, 100], [0, 2.0, 80]]),
                      np.ones((64, 64), np.float32))
    assert paste_faces_device(image, [face]).shape == image.shape


@pytest.mark.gpu
def test_cuda_deferred_nan_guard_recovers_the_batch_in_fp32():
    """On the GPU the runner reads the NaN guard's flag only when it collects a batch: a broken bf16 model's batch
    comes back as the fp32 model's crops, a healthy batch in flight next to it is untouched."""
    import copy

    from gpen_tune.model.io import to_model_input, to_uint8_nhwc
    from gpen_tune.tune import TuneConfig

    cuda_model = load_model("synthetic", model=GPENConfig(64, narrow=0.25), device="cuda")
    crops = list(samples.aligned_face_crops(64, 4))
    x = to_model_input(torch.from_numpy(np.stack(crops)).cuda())
    with torch.no_grad():
        want_fp32 = to_uint8_nhwc(cuda_model(x)).cpu().numpy().astype(int)
    broken = build_restorer(copy.deepcopy(cuda_model), TuneConfig(amp="bf16"), device="cuda", max_batch=4)
    with torch.no_grad():
        broken.model.ecd0[0][0].weight.mul_(float("inf"))
    healthy = build_restorer(copy.deepcopy(cuda_model), TuneConfig(amp="bf16"), device="cuda", max_batch=4)
    bad, good = broken, healthy
    first, second = bad.submit(crops), good.submit(crops)
    assert np.abs(np.stack(first.result()).astype(int) - want_fp32).max() <= TOLERANCE
    assert broken.fp32_reruns == 1 and first.device_out is not None
    assert np.abs(np.stack(second.result()).astype(int) - want_fp32).max() <= 12   # bf16 vs fp32, finite
    assert healthy.fp32_reruns == 0


def test_one_shape_padding_and_its_take_policy(model):
    """A one-shape Restorer (a compiled forward) pads to its limit and returns the rows asked for; its `take`
    lets the scheduler launch any count up to the limit (tests/pipeline/test_threads.py runs one)."""
    seen: list[int] = []

    def spy(x: torch.Tensor) -> torch.Tensor:
        seen.append(x.shape[0])
        return model(x)

    crops = list(samples.aligned_face_crops(64, 3))
    fixed = Restorer(spy, device="cpu", size=64, max_batch=4, one_shape=True)
    got = fixed.submit(crops).result()
    want = Restorer(model, device="cpu", size=64, max_batch=4).submit(crops).result()
    assert seen == [4] and len(got) == 3
    assert max(np.abs(a.astype(int) - b.astype(int)).max() for a, b in zip(got, want, strict=True)) <= TOLERANCE
    fixed.pad_to_buckets = True                      # as the service sets it: the smallest bucket that holds a batch
    seen.clear()
    for k in (1, 3, 2, 4):
        got = fixed.submit(crops[:k] if k <= 3 else crops + crops[:1]).result()
        assert len(got) == k
    assert seen == [1, 4, 2, 4]
    assert [fixed.padded_size(n) for n in (1, 2, 3, 4)] == [1, 2, 4, 4]
