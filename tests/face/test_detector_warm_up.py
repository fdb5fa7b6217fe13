"""The detector warm-up: built and run once on a thread while the generator loads, then used by the pipeline."""

from __future__ import annotations

import threading

import numpy as np

from gpen_tune.face import samples
from gpen_tune.face.detect import init_detector
from gpen_tune.face.detect.warm import DetectorWarmUp, warm_up_image
from gpen_tune.pipeline import EnhanceSettings, Pipeline


def warm_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "gpen-detector-warm-up"]


def test_warm_up_gives_a_detector_that_finds_the_same_faces():
    warm = DetectorWarmUp(lambda: init_detector("mtcnn", device="cpu"))
    detector = warm.result()
    assert warm.error is None and detector is not None and not warm_threads()
    photo = samples.astronaut()
    got, want = detector.detect([photo])[0], init_detector("mtcnn", device="cpu").detect([photo])[0]
    assert len(got) == len(want) == 1
    np.testing.assert_array_equal(got[0].landmarks, want[0].landmarks)
    image = warm_up_image()
    assert image.dtype == np.uint8 and image.shape == (320, 320, 3) and image.std() > 20


def test_a_failing_warm_up_is_dropped_with_its_error():
    warm = DetectorWarmUp(lambda: init_detector("no-such-detector", device="cpu"))
    assert warm.result() is None and warm.error is not None


def test_pipeline_with_the_warm_detector_restores_the_same_pixels():
    """warm_detector=True (the CUDA default) on the CPU: the pipeline takes the warm-up's detector and gives the
    pixels of a pipeline that built its own; a pipeline closed before it ever detected leaves no warm-up behind."""
    settings = EnhanceSettings(model="GPEN-BFR-256", weights="synthetic", detector="mtcnn", device="cpu")
    photo = samples.astronaut()
    outs = []
    for warm in (True, False):
        with Pipeline(settings, warm_detector=warm) as pipe:
            started = pipe._warm_up
            assert (started is not None) == warm
            assert pipe.prepare() == "mtcnn"
            if warm:                                   # the warm-up's detector is the one the pipeline runs
                assert pipe.detector("inline") is started.result()
            outs.append(pipe.enhance_image(photo))
    assert not np.array_equal(outs[0], photo)
    np.testing.assert_array_equal(outs[0], outs[1])
    Pipeline(settings, warm_detector=True).close()
    assert not warm_threads()
