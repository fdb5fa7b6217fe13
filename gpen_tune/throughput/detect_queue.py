"""The request queue shared by the detector servers (`detect_server.BatchingDetector`, a thread of this process,
and `detect_process.ProcessDetector`, a child process): callers enqueue a request and wait on it; the server takes
everything already waiting as one batch (continuous batching). No torch import: the process detector's module
must stay light."""

from __future__ import annotations

import queue
import threading

import numpy as np


class DetectRequest:
    """One caller's images, the server's answer (`result` or `error`), and `done` to wait on."""

    __slots__ = ("done", "error", "images", "result")

    def __init__(self, images: list[np.ndarray]):
        self.images = images
        self.done = threading.Event()
        self.result: list | None = None
        self.error: BaseException | None = None


def take_batch(requests: queue.Queue[DetectRequest | None], max_images: int) -> list[DetectRequest] | None:
    """Block for one request, then add everything already queued (never waits for company) up to `max_images`
    images. None means stop; a stop seen after the first request is put back, so it ends the next call."""
    req = requests.get()
    if req is None:
        return None
    batch, n = [req], len(req.images)
    while n < max_images:
        try:
            nxt = requests.get_nowait()
        except queue.Empty:
            break
        if nxt is None:
            requests.put(None)                 # stop after this batch
            break
        batch.append(nxt)
        n += len(nxt.images)
    return batch
