"""Detector services inside this process: one batching thread for many callers, and the lazy (releasable)
detector with the guard that makes it safe under many threads.

BatchingDetector: measured on the H200, prepare workers that each ran the detector themselves capped the folder
run at about 9 images/s whatever their number: the GPU detector's many small launches serialise on the GIL and
on one stream, so more threads only queue. Here the workers decode and align in parallel (OpenCV releases the
GIL) and hand their images to one server thread, which runs the detector on everything that queued up while its
previous call ran (continuous batching: no timer, so a lone caller never waits for company). A failing batch is
retried image by image, so one bad image fails only its own caller.

LazyDetector (the tune switch `lazy_detector`): builds the real detector on the first `detect`, and in
`before_restore` (called before each generator batch) deletes it, collects garbage and empties the CUDA cache
when free device memory is below `min_free_bytes` (policy "tight") or every time (policy "always"). Why: the
detector's weights and its cached cuDNN workspaces stay reserved for the whole run otherwise; upstream's
RetinaFace-R50 also turns on cuDNN benchmark mode whose workspaces can reach tens of GB. Releasing them gives the
generator that memory. Detections do not depend on when the detector was built; a rebuild costs tens of ms
(weights from the page cache) each time it was released.
"""

from __future__ import annotations

import functools
import gc
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
import torch

from gpen_tune.device_memory import cuda_memory
from gpen_tune.face.detect.base import Detection, detect_shrunk, follow_shrunk
from gpen_tune.tune.cuda_graph import settle

MAX_IMAGES = 32      # images per service call (a backend splits them by its own `max_batch`)
Policy = Literal["tight", "always", "never"]
POLICIES = ("tight", "always", "never")
DEFAULT_MIN_FREE_BYTES = 4 * 1024**3  # release when less than this is free before a generator batch


def follow_faces(detector: Any, images: Sequence[np.ndarray], boxes: Sequence[np.ndarray]) -> list[list[Detection]]:
    """Faces of every image near known boxes (`boxes[i]` [K, 4] in image i's coordinates): the detector's `follow`
    where it has one (`FaceDetector.follow`), else a full detection."""
    follow = getattr(detector, "follow", None)
    return follow(images, boxes) if callable(follow) else detector.detect(images)


class DetectRequest:
    """One caller's images (with `boxes` per image: a request to follow known faces, see `follow_faces`), the
    server's answer (`result` or `error`), and `done` to wait on."""

    __slots__ = ("boxes", "done", "error", "images", "result")

    def __init__(self, images: list[np.ndarray], boxes: list[np.ndarray] | None = None):
        self.images = images
        self.boxes = boxes
        self.done = threading.Event()
        self.result: list | None = None
        self.error: BaseException | None = None


def call_summary(service: Any) -> dict[str, Any] | None:
    """A batching service's calls, images, largest call, calls by their size and busy seconds (None for a detector
    that does not count them): whether detection kept up, and how many batch sizes a run met."""
    own = getattr(service, "__dict__", {})      # its own attributes: a lazy detector's forwarding would build it
    sizes = own.get("sizes")
    if sizes is None:
        return None
    busy = own.get("busy_s")
    return {"calls": service.calls, "images": service.images, "largest": service.largest,
            "calls_by_size": {str(k): v for k, v in sorted(sizes.items())},
            "busy_s": None if busy is None else round(busy, 4),
            "follow_calls": own.get("follow_calls", 0), "followed": own.get("followed", 0)}


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


class BatchingDetector:
    """Wraps a detector (anything with `detect(list_of_images) -> list`); thread-safe `detect`.

    Attributes (for the run report and benchmarks): `calls` detector calls made, `images` images detected,
    `largest` biggest batch, `sizes` calls by their number of images, `busy_s` wall seconds spent inside
    successful detector calls (follow calls included), `follow_calls` / `followed` calls and images that followed
    known faces; `own_stream` / `stream_priority` (see `_detect_on_own_stream`) and `max_images`
    (images per detector call) may be set before a run.
    Everything else (`name`, `device`, `det_size`, ...) is read from the wrapped detector.
    """

    def __init__(self, inner: Any, max_images: int = MAX_IMAGES, shrink_in_caller: bool = True):
        self._inner = inner
        # the shrink to det_size (cv2, releases the GIL) runs in each caller's thread instead of serially in the
        # server; det_size is read once here (reading it later from a lazy detector could rebuild it)
        self._det_size = getattr(inner, "det_size", None) if shrink_in_caller else None
        self.own_stream = True            # run the detector on its own CUDA stream (see _detect_on_own_stream)
        self._stream_priority = 0         # CUDA priority of that stream (lower = higher); -1 measured no faster
        self._stream = None
        self.max_images = max_images
        self._queue: queue.Queue[DetectRequest | None] = queue.Queue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.calls = 0
        self.images = 0
        self.largest = 0
        self.sizes: Counter[int] = Counter()   # detector calls by their number of images
        self.busy_s = 0.0                 # wall time inside detector calls (its share of a run: is it the limit?)
        self.follow_calls = 0
        self.followed = 0

    @property
    def inner(self) -> Any:
        return self._inner

    @property
    def name(self) -> str:
        return self._inner.name

    @property
    def stream_priority(self) -> int:
        return self._stream_priority

    @stream_priority.setter
    def stream_priority(self, priority: int) -> None:
        """A new priority takes a new stream at the next detector call."""
        self._stream_priority, self._stream = priority, None

    @property
    def device(self) -> torch.device:
        return torch.device(self._inner.device)

    def before_restore(self) -> None:
        """The wrapped detector's hook (a lazy one, behind its SharedDetector guard, may release itself)."""
        hook = getattr(self._inner, "before_restore", None)
        if callable(hook):
            hook()

    def detect(self, images: Sequence[np.ndarray]) -> list[list[Detection]]:
        if not images:
            return []
        if self._det_size:
            return detect_shrunk(self._detect, images, self._det_size)
        return self._detect(images)

    def follow(self, images: Sequence[np.ndarray], boxes: Sequence[np.ndarray]) -> list[list[Detection]]:
        """`follow_faces` through the server thread: shrunk in the caller, batched with other callers' follows."""
        if not images:
            return []
        return follow_shrunk(self._detect, images, boxes, self._det_size)

    def _detect(self, images: Sequence[np.ndarray], boxes: list[np.ndarray] | None = None) -> list:
        req = DetectRequest(list(images), boxes)
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
        while (batch := take_batch(self._queue, self.max_images)) is not None:
            self._run(batch)

    def _run(self, batch: list[DetectRequest]) -> None:
        """Detections and follows of one batch: one inner call for each kind present."""
        for group in ([r for r in batch if r.boxes is None], [r for r in batch if r.boxes is not None]):
            if group:
                self._run_group(group)

    def _run_group(self, batch: list[DetectRequest]) -> None:
        images = [im for r in batch for im in r.images]
        boxes = None if batch[0].boxes is None else [b for r in batch for b in r.boxes]
        start_s = time.perf_counter()
        try:
            found = self._detect_on_own_stream(images, boxes)
            self.busy_s += time.perf_counter() - start_s
            if boxes is None:
                self.calls += 1
                self.images += len(images)
                self.largest = max(self.largest, len(images))
                self.sizes[len(images)] += 1
            else:
                self.follow_calls += 1
                self.followed += len(images)
            start = 0
            for r in batch:
                r.result = found[start:start + len(r.images)]
                start += len(r.images)
        except BaseException as exc:
            if len(batch) == 1:
                batch[0].error = exc
            else:                               # isolate the failing image(s): one call per request
                for r in batch:
                    self._run_group([r])
                return
        for r in batch:
            r.done.set()

    def _detect_on_own_stream(self, images: list, boxes: list | None = None) -> list:
        """The detector's kernels and host syncs on a stream of their own: on the default stream every sync of the
        detector (a few per batch) also waited for the generator batch queued before it. A high-priority stream
        was tried and measured no faster (H200, A/B/A in one run: 385 / 419 / 397 faces/s for high / default /
        high, benchmarks/results/20261130-230700*), so it has the default priority."""
        device = getattr(self._inner, "device", None)
        call = self._inner.detect if boxes is None else functools.partial(follow_faces, self._inner, boxes=boxes)
        if not self.own_stream or device is None or torch.device(device).type != "cuda":
            return call(images)
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=device, priority=self._stream_priority)
        with torch.cuda.stream(self._stream):
            return call(images)

    def close(self, inner: bool = True) -> None:
        """Stop the serving thread; `inner=False` leaves the wrapped detector open (its owner closes it)."""
        with self._lock:
            self._closed = True
            thread = self._thread
            if thread is not None:
                self._queue.put(None)
        if thread is not None:
            thread.join()
        close = getattr(self._inner, "close", None)
        if inner and callable(close):
            close()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._inner, name)


class LazyDetector:
    """A detector built on demand and released before generator batches when memory is tight.

    Args:
        factory: builds the real detector (an object with `.detect(images)` and optionally `.close()`).
        policy: "tight" releases when free device memory < min_free_bytes, "always" releases before every
            generator batch, "never" keeps it (a plain lazily-built detector).
        min_free_bytes: threshold for "tight".
        device: the device whose free memory is checked (default: the detector's `.device`, else cuda:0).
        free_memory: (device) -> free bytes; default `gpen_tune.device_memory.cuda_memory`'s. Only the policy reads it.
    """

    def __init__(self, factory: Callable[[], Any], policy: Policy = "tight",
                 min_free_bytes: int = DEFAULT_MIN_FREE_BYTES, device: str | torch.device | None = None,
                 free_memory: Callable[[torch.device], int] | None = None):
        if policy not in POLICIES:
            raise ValueError(f"policy must be 'tight', 'always' or 'never', got {policy!r}")
        self.factory = factory
        self.policy = policy
        self.min_free_bytes = min_free_bytes
        self._device = torch.device(device) if device is not None else None
        self._free_memory = free_memory
        self._detector: Any | None = None
        self.builds = 0
        self.releases = 0

    @property
    def loaded(self) -> bool:
        return self._detector is not None

    @property
    def detector(self) -> Any:
        """The real detector, built now if needed."""
        if self._detector is None:
            self._detector = self.factory()
            self.builds += 1
        return self._detector

    @property
    def name(self) -> str:
        return getattr(self.detector, "name", type(self.detector).__name__)

    @property
    def device(self) -> torch.device:
        if self._device is not None:
            return self._device
        if self._detector is not None and getattr(self._detector, "device", None) is not None:
            return torch.device(self._detector.device)
        return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")

    def __getattr__(self, name: str) -> Any:
        """Anything else the pipeline reads (e.g. `det_size`) comes from the real detector, built if needed."""
        if name.startswith("_") or name in ("factory", "policy", "min_free_bytes", "builds", "releases"):
            raise AttributeError(name)
        return getattr(self.detector, name)

    def detect(self, images: Sequence[np.ndarray]) -> list[list[Detection]]:
        return self.detector.detect(images)

    def follow(self, images: Sequence[np.ndarray], boxes: Sequence[np.ndarray]) -> list[list[Detection]]:
        return follow_faces(self.detector, images, boxes)

    def to(self, device: str | torch.device) -> LazyDetector:
        self._device = torch.device(device)
        if self._detector is not None and hasattr(self._detector, "to"):
            self._detector = self._detector.to(device) or self._detector
        return self

    def before_restore(self) -> bool:
        """Called by the pipeline before each generator batch; returns True when the detector was released."""
        if self._detector is None or self.policy == "never":
            return False
        if self.policy == "always" or self._memory_is_tight():
            self.release()
            return True
        return False

    def close(self) -> None:
        self.release()

    def release(self) -> None:
        """Drop the detector: close it (frees its weights), delete our reference, collect, empty the CUDA cache."""
        det, self._detector = self._detector, None
        if det is None:
            return
        close = getattr(det, "close", None)
        if callable(close):
            close()
        del det, close
        gc.collect()
        settle(sync=False)
        self.releases += 1

    def _memory_is_tight(self) -> bool:
        device = self.device
        if self._free_memory is not None:
            return self._free_memory(device) < self.min_free_bytes
        memory = cuda_memory(device)
        if memory is None:
            return False  # nothing to free on the host
        return memory[0] < self.min_free_bytes


class SharedDetector:
    """Makes a releasable (lazy) detector safe under many threads: many callers detect at once, while the
    generator's thread's `before_restore` may release it. Detections share the detector; a release waits until
    none is running and new detections wait for the release (writer preference), and a rebuild happens once,
    under the lock. Everything else is read from the wrapped detector.
    """

    def __init__(self, inner: Any):
        self._inner = inner
        self._cond = threading.Condition()
        self._readers = 0
        self._releasing = False

    @property
    def inner(self) -> Any:
        return self._inner

    def detect(self, images: Sequence[np.ndarray]) -> list[list[Detection]]:
        return self._shared(self._inner.detect, images)

    def follow(self, images: Sequence[np.ndarray], boxes: Sequence[np.ndarray]) -> list[list[Detection]]:
        return self._shared(functools.partial(follow_faces, self._inner, boxes=boxes), images)

    def _shared(self, call: Callable[[Sequence[np.ndarray]], list], images: Sequence[np.ndarray]) -> list:
        with self._cond:
            while self._releasing:
                self._cond.wait()
            self._readers += 1
            if getattr(self._inner, "loaded", True) is False:
                _ = self._inner.detector           # rebuild once, here, not in several threads at the same time
        try:
            return call(images)
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    def before_restore(self) -> Any:
        with self._cond:
            self._releasing = True
            try:
                while self._readers:
                    self._cond.wait()
                return self._inner.before_restore()
            finally:
                self._releasing = False
                self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            close = getattr(self._inner, "close", None)
            if callable(close):
                close()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._inner, name)


def is_lazy(detector: Any) -> bool:
    """Whether `detector` is (or serves) a releasable detector."""
    while isinstance(detector, BatchingDetector | SharedDetector):
        detector = detector.inner
    return isinstance(detector, LazyDetector)
