"""The CPU MTCNN driver and our P-/R-/O-Net against facenet-pytorch's driver and networks (the reference), on
real photos: the same boxes, scores and landmarks to the bit."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest
import torch
from face_testdata import solvay_path

from gpen_tune.face import samples
from gpen_tune.face.detect import MTCNN_MIN_FACE, MTCNN_PYRAMID_FACTOR, MTCNN_STAGE_THRESHOLDS, MTCNNDetector, mtcnn_cpu
from gpen_tune.face.detect.mtcnn_cpu import BOXES_PER_CALL, detect_mtcnn_cpu
from gpen_tune.face.detect.mtcnn_nets import load_networks, weights_dir

pytestmark = pytest.mark.usefixtures("one_thread")


@cache
def ours():
    return load_networks("cpu")


@cache
def theirs():
    from facenet_pytorch.models.mtcnn import ONet, PNet, RNet

    return tuple(n().eval() for n in (PNet, RNet, ONet))


class InChunksOf(torch.nn.Module):
    """The reference's networks fed at most BOXES_PER_CALL crops per call, as our driver feeds them (the reference
    itself feeds 512: some CPUs round dense layers by batch size)."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x):
        parts = [self.net(x[i:i + BOXES_PER_CALL]) for i in range(0, len(x), BOXES_PER_CALL)]
        return tuple(torch.cat(p) for p in zip(*parts, strict=True))


def reference(image: np.ndarray):
    from facenet_pytorch.models.utils.detect_face import detect_face

    pnet, rnet, onet = theirs()
    with torch.inference_mode():
        boxes, points = detect_face(image[None], MTCNN_MIN_FACE, pnet, InChunksOf(rnet), InChunksOf(onet),
                                    list(MTCNN_STAGE_THRESHOLDS), MTCNN_PYRAMID_FACTOR, "cpu")
    b = np.asarray(boxes[0], dtype=np.float64).reshape(-1, 5)
    return b[:, :4], b[:, 4], np.asarray(points[0], dtype=np.float64).reshape(-1, 5, 2)


def photo(key: str) -> np.ndarray:
    if key == "solvay":
        path = solvay_path()
        if path is None:
            pytest.skip("the shared Solvay photo is not in this checkout")
        from gpen_tune.imageio import read_image

        return read_image(path).rgb8()
    if key == "crop":           # a face cut by the right border
        return np.ascontiguousarray(samples.mosaic(4, 3)[:700, :900])
    if key == "mosaic":
        return samples.mosaic(6, 0)
    return {"astronaut": samples.astronaut, "grace_hopper": samples.grace_hopper}[key]()


def test_networks_load_strictly_from_the_wheel_and_equal_the_reference():
    assert sorted(p.name for p in weights_dir().glob("*.pt")) == ["onet.pt", "pnet.pt", "rnet.pt"]
    g = torch.Generator().manual_seed(0)
    for mine, ref, side in zip(ours(), theirs(), (57, 24, 48), strict=True):
        x = torch.rand((9, 3, side, side), generator=g) * 2 - 1
        with torch.inference_mode():
            got, want = mine(x), ref(x)
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a, b)
        assert not any(p.requires_grad for p in mine.parameters())


@pytest.mark.parametrize("key", ["astronaut", "crop", *(pytest.param(k, marks=pytest.mark.slow)
                                                        for k in ("grace_hopper", "mosaic", "solvay"))])
def test_cpu_driver_equals_the_reference_to_the_bit(key):
    image = photo(key)
    boxes, scores, marks = detect_mtcnn_cpu(image, *ours(), MTCNN_MIN_FACE, MTCNN_STAGE_THRESHOLDS,
                                            MTCNN_PYRAMID_FACTOR)
    want_boxes, want_scores, want_marks = reference(image)
    assert boxes.dtype == scores.dtype == marks.dtype == np.float64
    assert len(boxes) == len(want_boxes) >= 1
    np.testing.assert_array_equal(boxes, want_boxes)
    np.testing.assert_array_equal(scores, want_scores)
    np.testing.assert_array_equal(marks, want_marks)
    assert np.all(np.diff(scores) <= 0)                   # highest score first


def test_detector_on_the_cpu_runs_each_image_alone():
    """A same-size stack gives each image what it gets alone, bit for bit (no batch mates in any call)."""
    det = MTCNNDetector("cpu")
    a, b = samples.astronaut()[:320, 100:420].copy(), np.ascontiguousarray(samples.mosaic(4, 3)[:320, :320])
    together = det._detect_batch(np.stack([a, b]))
    for image, got in zip((a, b), together, strict=True):
        alone = det._detect_batch(image[None])[0]
        for x, y in zip(got, alone, strict=True):
            np.testing.assert_array_equal(x, y)


def test_no_faces_and_images_too_small_for_the_pyramid():
    blank = np.full((64, 80, 3), 128, np.uint8)
    tiny = samples.astronaut()[:11, :11].copy()                  # below P-Net's 12 px window at every scale
    for image in (blank, tiny):
        boxes, scores, marks = detect_mtcnn_cpu(image, *ours())
        assert boxes.shape == (0, 4) and scores.shape == (0,) and marks.shape == (0, 5, 2)
    with pytest.raises(ValueError, match="uint8"):
        detect_mtcnn_cpu(blank.astype(np.float32), *ours())


def test_rnet_onet_in_chunks_equal_one_call():
    """R-Net / O-Net see at most BOXES_PER_CALL crops per call (a lower memory peak); the outputs are those of one
    call over every crop, to float32 rounding (bit-equal on an AMD EPYC Zen 4; on an Intel Xeon, O-Net's dense
    layers round by batch size: 1.2e-7 apart)."""
    g = torch.Generator().manual_seed(0)
    _, rnet, onet = ours()
    for net, side in ((rnet, 24), (onet, 48)):
        crops = torch.rand((BOXES_PER_CALL * 2 + 37, 3, side, side), generator=g) * 2 - 1
        with torch.inference_mode():
            whole, chunked = net(crops), mtcnn_cpu._in_chunks(net, crops)
        assert len(whole) == len(chunked)
        for a, b in zip(whole, chunked, strict=True):
            assert a.shape == b.shape and float((a - b).abs().max()) <= 1e-6
