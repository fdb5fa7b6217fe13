"""The pipeline's library API (Pipeline, enhance_image) on the CPU with real photos and a tiny GPEN."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from face_testdata import detections, mtcnn, serial_run
from model_configs import SMALLEST
from PIL import Image

import gpen_tune
from gpen_tune.face import samples
from gpen_tune.model.configs import GPENConfig
from gpen_tune.model.io import to_uint8_nhwc
from gpen_tune.pipeline import EnhanceSettings, FileSink, FileSource, OutputNaming, Pipeline
from gpen_tune.pipeline.settings import resolve_device
from gpen_tune.restore import as_restorer
from gpen_tune.tune import TuneConfig

MODEL = "GPEN-BFR-256"


@pytest.fixture(scope="module")
def model():
    """A tiny real GPEN (64 px, narrow 0.25, synthetic weights): the library tests need speed, not quality."""
    return gpen_tune.load_model("synthetic", model=GPENConfig(64, narrow=0.25), device="cpu")


# ---------------------------------------------------------------------------------------------- library API


class CountingDetector:
    """The lazy-detector interface around the real MTCNN: counts `before_restore` calls."""

    name = "mtcnn"

    def __init__(self):
        self.inner, self.hooks = mtcnn(), 0

    def detect(self, images):
        return self.inner.detect(images)

    def before_restore(self):
        self.hooks += 1

    def close(self):
        pass


def test_faces_of_several_images_share_batches(model):
    calls: list[int] = []

    def restore(x):
        calls.append(x.shape[0])
        assert x.dtype == torch.float32 and -1.0 <= x.min() and x.max() <= 1.0
        return model(x)

    det = CountingDetector()
    images = [samples.astronaut(), samples.grace_hopper(), samples.mosaic()]
    restorer = as_restorer(restore, device="cpu", size=64, max_batch=3)
    pipe = Pipeline(EnhanceSettings(device="cpu", batch_size=3), TuneConfig(lazy_detector=True), restorer=restorer,
                    detector=det)
    sink = serial_run(pipe, images)
    assert [len(sink.jobs[i].faces) for i in range(3)] == [1, 1, 6]
    assert calls == [3, 3, 2] and det.hooks == 3                 # 8 faces of 3 images in 3 batches
    for i, j in sink.jobs.items():
        assert j.status == "ok" and sink.results[i].shape == images[i].shape
        assert j.timings["restore"] > 0 and all(r.shape == (64, 64, 3) for r in sink.restored[i])


def test_enhance_image_library_call(model):
    img = samples.astronaut()
    out = gpen_tune.enhance_image(img, weights="synthetic", model=MODEL, detector="mtcnn", device="cpu")
    assert out.shape == img.shape and out.dtype == np.uint8 and not np.array_equal(out, img)
    changed = (out != img).any(axis=2)
    ys, xs = np.nonzero(changed)
    assert 100 < xs.mean() < 350 and ys.mean() < 250          # only around the face
    zero = Pipeline(EnhanceSettings(device="cpu", strength=0.0), model=model, detector=CountingDetector())
    assert np.array_equal(gpen_tune.enhance_image(img, pipeline=zero), img)
    one = Pipeline(EnhanceSettings(device="cpu"), model=model, detector=CountingDetector())
    flat = np.full((100, 140), 77, np.uint8)
    assert np.array_equal(gpen_tune.enhance_image(flat, pipeline=one), flat)   # grayscale, no face: unchanged


def test_only_center_face_and_ffhq_template(model):
    det = CountingDetector()
    pipe = Pipeline(EnhanceSettings(device="cpu", only_center_face=True, template="ffhq"), model=model, detector=det)
    job = serial_run(pipe, [samples.mosaic()]).jobs[0]
    assert len(job.faces) == 1
    _, dets = detections("mosaic")
    h, w = samples.mosaic().shape[:2]
    centre = np.array([w / 2, h / 2])
    best = min(dets, key=lambda d: np.linalg.norm((d.box[:2] + d.box[2:]) / 2 - centre))
    np.testing.assert_allclose(job.faces[0].detection.box, best.box)


def test_aligned_inputs(model):
    crops = samples.aligned_face_crops(64, n=10)
    assert crops.shape == (10, 64, 64, 3) and crops.dtype == np.uint8
    assert not np.array_equal(crops[0], crops[1]) and np.array_equal(crops[0], crops[8])   # 8 faces, repeated
    pipe = Pipeline(EnhanceSettings(device="cpu", aligned=True, strength=0.5), model=model)
    big = np.ascontiguousarray(np.kron(crops[0], np.ones((2, 2, 1), np.uint8)))   # a 128-px aligned face
    sink = serial_run(pipe, [crops[1], big])
    full, half = sink.results[0], sink.results[1]
    assert full.shape == (64, 64, 3) and half.shape == (128, 128, 3)
    restored = sink.restored[0][0].astype(float)
    np.testing.assert_allclose(full, (restored + crops[1]) / 2, atol=1.01)
    assert pipe.prepare() is None                                # no detector for aligned inputs


def test_bf16_model_gets_bf16_batches():
    m = gpen_tune.load_model("synthetic", model=SMALLEST, device="cpu", dtype=torch.bfloat16)
    pipe = Pipeline(EnhanceSettings(device="cpu"), model=m)
    assert pipe.restorer.dtype == torch.bfloat16
    out = pipe.restorer.restore_crops(samples.aligned_face_crops(SMALLEST.size, n=2))
    assert out.shape == (2, 16, 16, 3) and out.dtype == np.uint8


def test_output_conversion_rounds_and_clips():
    y = torch.tensor([-2.0, -1.0, 0.0, 1.0, 3.0, -1 + 2 * 100.4 / 255, -1 + 2 * 100.6 / 255]).view(1, 1, 1, 7)
    y = y.expand(1, 3, 1, 7)
    assert to_uint8_nhwc(y)[0, 0, :, 0].tolist() == [0, 0, 128, 255, 255, 100, 101]


def test_device_choice():
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="cuda"):
            resolve_device("cuda")
        notes: list[str] = []
        assert resolve_device("auto", notes.append).type in ("cpu", "mps")
        assert notes and "CPU" in notes[0] or resolve_device("auto").type == "mps"
    assert resolve_device("cpu").type == "cpu"


def test_exif_rotated_photo_is_restored_upright(tmp_path, model):
    side = np.ascontiguousarray(np.rot90(samples.astronaut(), 1))     # stored sideways ...
    exif = Image.Exif()
    exif[0x0112] = 6                                                  # ... and tagged "rotate 90 CW to view"
    path = tmp_path / "side.jpg"
    Image.fromarray(side).save(path, exif=exif, quality=95)
    pipe = Pipeline(EnhanceSettings(device="cpu"), model=model, detector=CountingDetector())
    summary = pipe.run(FileSource([path], ["o"]), FileSink(OutputNaming(tmp_path / "out")), serial=True)
    (job,) = summary.results
    assert job.size == (512, 512) and len(job.faces) == 1 and job.status == "ok"   # upright: MTCNN finds it
    with Image.open(job.output) as im:
        assert im.size == (512, 512) and im.getexif().get(0x0112) == 1
