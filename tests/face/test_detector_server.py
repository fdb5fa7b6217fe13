"""The detector's batching thread (gpen_tune.face.detect.BatchingDetector) on the real MTCNN: waiting callers
share one call, a bad image fails only its caller, detections equal the detector's own."""

from __future__ import annotations

import threading
import time

import cv2
import numpy as np
import pytest

from gpen_tune.face import samples


class _GatedDetector:
    """The real MTCNN behind a gate: its first call waits until the test opens the gate, so the requests of the
    other threads are all queued by then (ordering by an Event, not by timing). Records each call's batch size."""

    def __init__(self):
        from face_testdata import mtcnn

        self.inner = mtcnn()
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.sizes: list[int] = []

    def detect(self, images):
        self.entered.set()
        self.gate.wait()
        self.sizes.append(len(images))
        if any(im.ndim != 3 for im in images):
            raise ValueError("detector input must be HWC RGB uint8")
        return self.inner.detect(images)


@pytest.mark.slow
def test_detector_server_batches_waiting_callers_and_isolates_failures():
    from gpen_tune.face.detect import BatchingDetector

    photos = [samples.astronaut(), samples.grace_hopper(), samples.mosaic(4, 0), samples.astronaut()[::2, ::2].copy()]
    alone = [len(d) for d in _GatedDetector().inner.detect(photos)]
    gated = _GatedDetector()
    server = BatchingDetector(gated)
    got: dict[int, object] = {}

    def call(i, img):
        try:
            got[i] = server.detect([img])[0]
        except Exception as exc:
            got[i] = exc

    first = threading.Thread(target=call, args=(0, photos[0]))
    first.start()
    gated.entered.wait()                          # the server is inside its first call
    bad = np.zeros((8, 8), np.uint8)              # not an image: fails, but only for its caller
    others = [threading.Thread(target=call, args=(i, img)) for i, img in enumerate([*photos[1:], bad], start=1)]
    for t in others:
        t.start()
    while server._queue.qsize() < len(others):    # all queued behind the blocked first call
        time.sleep(0.01)
    gated.gate.set()
    for t in [first, *others]:
        t.join()
    server.close()
    assert gated.sizes[:2] == [1, 4]              # the second call took the four waiting requests at once
    assert (server.calls, server.images) == (4, 4) and server.busy_s > 0   # 1, then 3 retried alone (bad one failed)
    assert [len(got[i]) for i in range(4)] == alone and alone[:3] == [1, 1, 4]
    assert isinstance(got[4], ValueError)
    with pytest.raises(RuntimeError, match="closed"):
        server.detect([photos[0]])


@pytest.mark.slow
def test_detector_server_shrinks_in_the_callers_thread_with_identical_detections():
    from face_testdata import mtcnn

    from gpen_tune.face.detect import BatchingDetector

    inner = mtcnn()
    big = cv2.resize(samples.mosaic(4, 0), None, fx=1.6, fy=1.6, interpolation=cv2.INTER_CUBIC)
    assert max(big.shape[:2]) > inner.det_size                     # the shrink matters for this one
    photos = [big, samples.astronaut()]
    want = inner.detect(photos)
    server = BatchingDetector(inner)
    try:
        got = server.detect(photos)
    finally:
        server._queue.put(None)                                    # stop the thread, keep the shared detector
    assert [len(g) for g in got] == [len(w) for w in want] == [4, 1]
    for g_img, w_img in zip(got, want, strict=True):
        for g, w in zip(g_img, w_img, strict=True):
            assert np.array_equal(g.box, w.box) and np.array_equal(g.landmarks, w.landmarks) and g.score == w.score
