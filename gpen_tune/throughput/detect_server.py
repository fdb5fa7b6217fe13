"""One detector thread for many prepare workers: their `detect` calls are served in batches.

Why: measured on the H200, prepare workers that each ran the detector themselves capped the folder run at about
9 images/s whatever their number: the GPU detector's many small launches serialise on the GIL and on one stream,
so more threads only queue. Here the workers decode and align in parallel (OpenCV releases the GIL) and hand
their images to one server thread, which runs the detector on everything that queued up while its previous
call ran (continuous batching: no timer, so a lone caller never waits for company).
A failing batch is retried image by image, so one bad image fails only its own caller.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from gpen_tune.face.detect import detect_shrunk
from gpen_tune.throughput.detect_queue import DetectRequest, take_batch

MAX_IMAGES = 32      # images per detector call (the batched MTCNN bounds its own memory per chunk)


class BatchingDetector:
    """Wraps a detector (anything with `detect(list_of_images) -> list`); thread-safe `detect`.

    Attributes (for benchmarks): `calls` detector calls made, `images` images detected, `largest` biggest batch,
    `busy_s` wall seconds spent inside successful detector calls.
    Everything else (`name`, `before_restore`, ...) is forwarded to the wrapped detector.
    """

    def __init__(self, inner: Any, max_images: int = MAX_IMAGES, shrink_in_caller: bool = True):
        self._inner = inner
        # the shrink to det_size (cv2, releases the GIL) runs in each caller's thread instead of serially in the
        # server; det_size is read once here (reading it later from a lazy detector could rebuild it)
        self._det_size = getattr(inner, "det_size", None) if shrink_in_caller else None
        self.own_stream = True            # run the detector on its own CUDA stream (see _detect_on_own_stream)
        self._stream = None
        self._max_images = max_images
        self._queue: queue.Queue[DetectRequest | None] = queue.Queue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.calls = 0
        self.images = 0
        self.largest = 0
        self.busy_s = 0.0                 # wall time inside detector calls (its share of a run: is it the limit?)

    @property
    def inner(self) -> Any:
        return self._inner

    def detect(self, images: Sequence[np.ndarray]) -> list:
        if not images:
            return []
        if self._det_size:
            return detect_shrunk(self._detect, images, self._det_size)
        return self._detect(images)

    def _detect(self, images: Sequence[np.ndarray]) -> list:
        req = DetectRequest(list(images))
        with self._lock:
            if self._closed:
                raise RuntimeError("detector was closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="gpen-detect", daemon=True)
                self._thread.start()
            self._queue.put(req)
        req.done.wait()
        if req.error is not None:
            raise req.error
        return req.result

    def _serve(self) -> None:
        while (batch := take_batch(self._queue, self._max_images)) is not None:
            self._run(batch)

    def _run(self, batch: list[DetectRequest]) -> None:
        images = [im for r in batch for im in r.images]
        start_s = time.perf_counter()
        try:
            found = self._detect_on_own_stream(images)
            self.busy_s += time.perf_counter() - start_s
            self.calls += 1
            self.images += len(images)
            self.largest = max(self.largest, len(images))
            start = 0
            for r in batch:
                r.result = found[start:start + len(r.images)]
                start += len(r.images)
        except BaseException as exc:
            if len(batch) == 1:
                batch[0].error = exc
            else:                               # isolate the failing image(s): one call per request
                for r in batch:
                    self._run([r])
                return
        for r in batch:
            r.done.set()

    def _detect_on_own_stream(self, images: list) -> list:
        """The detector's kernels and host syncs on a stream of their own: on the default stream every sync of the
        detector (a few per batch) also waited for the generator batch queued before it. A high-priority stream
        was tried and measured no faster (H200, A/B/A in one run: 385 / 419 / 397 faces/s for high / default /
        high, benchmarks/results/20261130-230700*), so it has the default priority."""
        device = getattr(self._inner, "device", None)
        if not self.own_stream or device is None or torch.device(device).type != "cuda":
            return self._inner.detect(images)
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=device)
        with torch.cuda.stream(self._stream):
            return self._inner.detect(images)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            thread = self._thread
            if thread is not None:
                self._queue.put(None)
        if thread is not None:
            thread.join()
        close = getattr(self._inner, "close", None)
        if callable(close):
            close()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._inner, name)
