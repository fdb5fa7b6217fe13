"""Opt-in: the face detector in a worker process of its own, serving the prepare threads in batches.

Why: in a folder run the detector thread of `services.BatchingDetector` runs hundreds of small torch ops
per batch in Python (`mtcnn_batched`) and competes for the GIL with ~60 other threads (H200: ~73
images/s in the run against 292 images/s for the same driver alone, py-spy shows the GIL). A process has its
own GIL and its own CUDA context. Measured (H200, no MPS, `benchmarks/throughput.py`): no faster while other
stages also limited (331 vs 341 faces/s, 20261201-022528); once the detector was the only limit, faster
in every comparison: 620 / 623 vs 598 / 547 faces/s on 1,024 photos (20261201-080529), 693 vs 625 on 4,096
(20261201-081014). It stays opt-in (`enhance --detector-process`) because its start (spawn, import, CUDA context,
P-Net graphs) takes ~10 s. Without MPS the GPU time-slices between the two processes' contexts, so the
detector's kernels no longer overlap the generator's as they do on a second stream of one process (the
generator's event time per face was ~12 % higher); with MPS it is unmeasured.

How: the batching is the same as BatchingDetector's (callers shrink to det_size in their own threads; a server
thread in this process takes everything queued, up to MAX_IMAGES, per call). The server thread copies the batch's
pixels into one reusable shared-memory segment (images back to back at 64-byte aligned offsets, grown when a batch
needs more) and sends only the layout through a pipe; the child detects on views of the segment and answers with
boxes, scores and landmarks per image. One batch is in flight at a time, so the segment is never written while
the child reads it. A failing batch is retried request by request in the child, so one bad image fails only its
caller; the child's exceptions are re-raised in that caller. With `processes` > 1 each child has its own thread and
segment here, and the threads take batches from one queue. A child leaves when the parent closes it or dies
(EOF on the pipe; it is also a daemon). It is started with "spawn" (no fork of a threaded CUDA process), so a
script that builds one needs the `if __name__ == "__main__":` guard (the child re-imports the main module).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import queue
import signal
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import numpy as np
import torch

from gpen_tune.child_process import detach, pickled, rebuilt
from gpen_tune.face.detect.base import DEFAULT_DET_SIZE, Detection, detect_shrunk
from gpen_tune.face.detect.build import build_backend
from gpen_tune.face.detect.services import MAX_IMAGES, BatchingDetector, DetectRequest, is_lazy, take_batch

MIN_SEGMENT_BYTES = 32 << 20    # first shared-memory segment (pages are only committed when written)
ALIGN = 64                      # byte alignment of each image in the segment
START_TIMEOUT_S = 300.0         # spawn + import torch + build the detector (+ CUDA context) must fit in this
STOP_TIMEOUT_S = 10.0           # close(): how long the child may take to exit before it is terminated

_Packed = tuple[np.ndarray, np.ndarray, np.ndarray]       # boxes [N, 4], scores [N], landmarks [N, 5, 2]


LAZY_REFUSED = ("the process detector does not support the lazy detector (--lazy-detector frees memory in this "
                "process, the detector process holds its own): use one or the other")


class DetectorProcessError(RuntimeError):
    """The detector process failed (did not start, died, or raised an exception that could not be sent back)."""


@dataclass(frozen=True)
class DetectorSpec:
    """What the child needs to build the detector itself (picklable; the networks are never sent).

    `torch_threads`: the child's intra-op threads (the parent's count by default: on the CPU it also decides
    convolution code paths, so the same count gives the same detections)."""

    name: str = "mtcnn"
    device: str = "cpu"
    threshold: float | None = None
    det_size: int | None = DEFAULT_DET_SIZE
    weights: str | None = None
    torch_threads: int | None = None

    @classmethod
    def of(cls, detector: Any, weights: str | None = None) -> DetectorSpec:
        """The spec of a built backend (a BatchingDetector is looked through); a lazy one is refused. `weights`:
        the backend's weights file when None (RetinaFace's; MTCNN's ship with facenet-pytorch)."""
        if is_lazy(detector):
            raise ValueError(LAZY_REFUSED)
        while isinstance(detector, BatchingDetector):
            detector = detector.inner
        weights = weights if weights is not None else getattr(detector, "weights_path", None)
        return cls(name=detector.name, device=str(detector.device), threshold=detector.threshold,
                   det_size=detector.det_size, weights=None if weights is None else str(weights),
                   torch_threads=torch.get_num_threads())

    def build(self) -> Any:
        """The backend itself (in the child)."""
        return build_backend(self.name, device=self.device, weights=self.weights, threshold=self.threshold,
                             det_size=self.det_size)


class _Link:
    """One connection to a detector process: its pipe, the shared-memory segment its batches go through, and the
    thread here that feeds it (a `DetectorHost`'s clients hold one each)."""

    process: Any = None

    def __init__(self, conn: Any, name: str):
        self.conn, self.name = conn, name
        self.shm: SharedMemory | None = None
        self.thread: threading.Thread | None = None
        self.calls = 0                   # batches this link's process detected

    def wait_ready(self, timeout_s: float) -> dict:
        try:
            if not self.conn.poll(timeout_s):
                raise DetectorProcessError(f"the detector process did not start within {timeout_s:.0f} s")
            kind, payload = self.conn.recv()
        except (EOFError, OSError):
            raise DetectorProcessError(f"the detector process exited{self._exit()} before it was ready") from None
        if kind == "error":
            raise _exception(payload)
        return payload

    def pack(self, images: list[np.ndarray]) -> list[tuple[int, tuple[int, ...]]]:
        """Copy the images into the segment (grown if needed); (offset, shape) of each."""
        layout, end = [], 0
        for img in images:
            layout.append((end, img.shape))
            end += -(-img.nbytes // ALIGN) * ALIGN
        if self.shm is None or self.shm.size < end:
            size = max(end, MIN_SEGMENT_BYTES, 2 * self.shm.size if self.shm is not None else 0)
            new = SharedMemory(create=True, size=size)
            self.free_segment()
            self.shm = new                     # the child attaches to it at the next batch, by name
        buf = self.shm.buf
        for img, (offset, shape) in zip(images, layout, strict=True):
            np.ndarray(shape, np.uint8, buffer=buf, offset=offset)[...] = img
        return layout

    def free_segment(self) -> None:
        if self.shm is not None:
            self.shm.close()
            with contextlib.suppress(FileNotFoundError):
                self.shm.unlink()
            self.shm = None

    def lost(self) -> DetectorProcessError:
        """What callers are told once the process is gone."""
        return DetectorProcessError(f"the detector process died{self._exit()}")

    def _exit(self) -> str:
        return ""

    def stop(self) -> None:
        self.conn.close()


class _Child(_Link):
    """One detector process this process started, and its link."""

    def __init__(self, ctx: Any, spec: DetectorSpec, index: int):
        conn, child_conn = ctx.Pipe()
        name = "gpen-detect-process" if index == 0 else f"gpen-detect-process-{index}"
        super().__init__(conn, name)
        self.process = ctx.Process(target=_child_main, args=(spec, child_conn), daemon=True, name=name)
        self.process.start()
        child_conn.close()               # only the child holds its end: its death reads as EOF here

    def _exit(self) -> str:
        self.process.join(1.0)
        return f" (exit code {self.process.exitcode})"

    def stop(self) -> None:
        """Wait for the child to exit, then terminate it, then kill it."""
        self.process.join(STOP_TIMEOUT_S)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(STOP_TIMEOUT_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


class ProcessDetector:
    """A detector in one or more child processes; thread-safe `detect(images) -> list[list[Detection]]`.

    `processes`: children that detect side by side, each with one batch in flight, all fed from one queue (a
    GPU detection is mostly host work, launches and syncs, so children scale until the GPU or the cores are full).
    Attributes (for benchmarks): `calls` detector calls, `images` images detected, `largest` biggest batch;
    `name`, `device`, `threshold`, `det_size` as the children's detector; `process` the first child (a spawn
    Process), `children_processes` all of them. `shrink_in_caller`: shrink to det_size in the calling thread (else
    the children's detector does it).
    """

    def __init__(self, spec: DetectorSpec, max_images: int = MAX_IMAGES, shrink_in_caller: bool = True,
                 start_timeout_s: float = START_TIMEOUT_S, processes: int = 1):
        if processes < 1:
            raise ValueError(f"detector processes must be >= 1, got {processes}")
        self.spec = spec
        self.shrink_in_caller = shrink_in_caller
        self._max_images = max_images
        ctx = mp.get_context("spawn")
        children = [_Child(ctx, spec, i) for i in range(processes)]    # started side by side
        try:
            ready = [child.wait_ready(start_timeout_s) for child in children][0]
        except BaseException:
            for child in children:
                with contextlib.suppress(OSError):
                    child.conn.send(("close",))
                child.stop()
            raise
        self._start(children, ready)

    @classmethod
    def attached(cls, conn: Any, max_images: int = MAX_IMAGES,
                 start_timeout_s: float = START_TIMEOUT_S) -> ProcessDetector:
        """The detector of a process another process started (a `DetectorHost`, serving several processes at once),
        reached over `conn`; waits until it is ready."""
        link = _Link(conn, "gpen-detect-host")
        ready = link.wait_ready(start_timeout_s)
        self = cls.__new__(cls)
        self.spec, self.shrink_in_caller, self._max_images = None, True, max_images
        self._start([link], ready)
        return self

    def _start(self, links: list[_Link], ready: dict) -> None:
        self._children = links
        self.name, self.threshold, self.det_size = ready["name"], ready["threshold"], ready["det_size"]
        self.device = torch.device(ready["device"])
        self._queue: queue.Queue[DetectRequest | None] = queue.Queue()
        self._lock = threading.Lock()            # the queue's close, and the counters below
        self._closed = False
        self._dead: BaseException | None = None
        self.calls = 0
        self.images = 0
        self.largest = 0
        self.sizes: Counter[int] = Counter()   # detector calls by their number of images
        for i, link in enumerate(links):
            link.thread = threading.Thread(target=self._serve, args=(link,), daemon=True,
                                           name="gpen-detect-process-io" + (f"-{i}" if i else ""))
            link.thread.start()

    # -- callers ------------------------------------------------------------------------------------------------
    def detect(self, images: Sequence[np.ndarray]) -> list[list[Detection]]:
        """Faces of every image (as the in-process detector: highest score first, original coordinates)."""
        if not images:
            return []
        if self.shrink_in_caller and self.det_size:
            return detect_shrunk(self._detect, images, self.det_size)
        return self._detect([_checked(img) for img in images])

    def _detect(self, images: list[np.ndarray]) -> list:
        req = DetectRequest(images)
        with self._lock:
            if self._closed:
                raise RuntimeError("detector was closed")
            self._queue.put(req)
        req.done.wait()
        if req.error is not None:
            raise req.error
        return [_unpack(p) for p in req.result]

    # -- server threads (one per child) -------------------------------------------------------------------------
    def _serve(self, child: _Link) -> None:
        while True:
            batch = take_batch(self._queue, self._max_images)
            if batch is None:
                return
            if self._dead is not None:
                _finish(batch, error=self._dead)
            else:
                self._run(child, batch)

    def _run(self, child: _Link, batch: list[DetectRequest]) -> None:
        images = [im for r in batch for im in r.images]
        try:
            layout = child.pack(images)
        except Exception as exc:                # e.g. no room for a huge batch: retry request by request
            if len(batch) == 1:
                _finish(batch, error=exc)
            else:
                for r in batch:
                    self._run(child, [r])
            return
        try:
            child.conn.send(("detect", child.shm.name, layout, [len(r.images) for r in batch]))
            replies = child.conn.recv()
        except (EOFError, OSError):
            self._dead = child.lost()
            _finish(batch, error=self._dead)
            return
        child.calls += 1
        with self._lock:
            self.calls += 1
            self.images += len(images)
            self.largest = max(self.largest, len(images))
            self.sizes[len(images)] += 1
        for r, (kind, payload) in zip(batch, replies, strict=True):
            if kind == "ok":
                r.result = payload
            else:
                r.error = _exception(payload)
        _finish(batch)

    @property
    def process(self) -> Any:
        """The first child (a spawn Process)."""
        return self._children[0].process

    @property
    def children_processes(self) -> list[Any]:
        """Every child, in start order."""
        return [c.process for c in self._children]

    @property
    def calls_by_process(self) -> list[int]:
        """Detector calls each child made (whether the children shared the work)."""
        return [c.calls for c in self._children]

    def before_restore(self) -> None:
        """Nothing to release in this process (the children hold the detector)."""

    # -- shutdown -----------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Finish the queued requests, stop the children (terminated if they do not exit in time), free the
        segments."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for _ in self._children:
                self._queue.put(None)
        for child in self._children:
            child.thread.join()
        for child in self._children:
            with contextlib.suppress(OSError):
                child.conn.send(("close",))
        for child in self._children:
            child.stop()
            child.free_segment()

    def __repr__(self) -> str:
        pids = ", ".join(str(c.process.pid) for c in self._children if c.process is not None)
        return f"ProcessDetector(name={self.name!r}, device={str(self.device)!r}, pids=[{pids}])"


def _checked(img: np.ndarray) -> np.ndarray:
    """Pixels travel as raw uint8 bytes; the shape is the child's detector's to judge."""
    if not isinstance(img, np.ndarray) or img.dtype != np.uint8:
        raise ValueError(f"detector input must be a uint8 array, got {type(img).__name__} "
                         f"{getattr(img, 'dtype', '')}".rstrip())
    return img


def _finish(batch: list[DetectRequest], error: BaseException | None = None) -> None:
    for r in batch:
        if error is not None:
            r.error = error
        r.done.set()


def _exception(payload: bytes | str) -> BaseException:
    """The child's exception, or a DetectorProcessError with its text when it could not be rebuilt."""
    return rebuilt(payload, DetectorProcessError)


def _unpack(packed: _Packed) -> list[Detection]:
    boxes, scores, lms = packed
    return [Detection(box=boxes[i], score=float(scores[i]), landmarks=lms[i]) for i in range(len(scores))]


# ---------------------------------------------------------------------------------------------------- the child


def _child_main(spec: DetectorSpec, conn: Any) -> None:
    """Build the detector, then serve batches until the parent says close or goes away (EOF on the pipe)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)    # Ctrl-C is the parent's to handle; it closes us
    try:
        detector = start_detector(spec)
    except BaseException as exc:  # noqa: BLE001 - every start failure goes back to the parent
        conn.send(("error", pickled(exc)))
        return
    conn.send(("ready", ready_info(detector)))
    shm: SharedMemory | None = None
    try:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                return                          # the parent died
            if msg[0] == "close":
                return
            _, name, layout, counts = msg
            if shm is None or shm.name != name:         # the parent grew the segment
                detach(shm)
                shm = SharedMemory(name=name)
            conn.send(detect_requests(detector, views(shm, layout), counts))
    finally:
        detach(shm)
        close_detector(detector)


def start_detector(spec: DetectorSpec) -> Any:
    """In a detector process: torch's threads, the backend, and MTCNN's P-Net graphs now (not inside the first
    batches)."""
    if spec.torch_threads:
        torch.set_num_threads(spec.torch_threads)
    detector = spec.build()
    capture = getattr(detector, "capture_graphs", None)
    if capture is not None:
        capture()
    return detector


def ready_info(detector: Any) -> dict:
    """What a detector process tells its callers once ready (`ProcessDetector` keeps it as its attributes)."""
    return {"name": detector.name, "device": str(detector.device), "threshold": detector.threshold,
            "det_size": detector.det_size}


def close_detector(detector: Any) -> None:
    close = getattr(detector, "close", None)
    if callable(close):
        close()


def views(shm: SharedMemory, layout: list) -> list[np.ndarray]:
    """The images a batch's layout places in the segment."""
    return [np.ndarray(shape, np.uint8, buffer=shm.buf, offset=offset) for offset, shape in layout]


def detect_requests(detector: Any, images: list[np.ndarray], counts: list[int]) -> list:
    """("ok", packed detections per image) or ("error", pickled exception) per request (`counts`: its images,
    in order); a failing batch is retried request by request so that only the bad request fails."""
    try:
        found = detector.detect(images)
    except Exception as exc:  # noqa: BLE001 - goes back to its caller(s)
        if len(counts) == 1:
            return [("error", pickled(exc))]
        return [_detect_one(detector, part) for part in _split(images, counts)]
    return [("ok", [_pack_detections(d) for d in part]) for part in _split(found, counts)]


def _detect_one(detector: Any, images: list[np.ndarray]) -> tuple[str, Any]:
    try:
        return "ok", [_pack_detections(d) for d in detector.detect(images)]
    except Exception as exc:  # noqa: BLE001 - goes back to its caller
        return "error", pickled(exc)


def _split(items: list, counts: list[int]) -> list[list]:
    out, start = [], 0
    for n in counts:
        out.append(items[start:start + n])
        start += n
    return out


def _pack_detections(dets: list) -> _Packed:
    if not dets:
        return np.zeros((0, 4)), np.zeros(0), np.zeros((0, 5, 2))
    return (np.stack([d.box for d in dets]), np.array([d.score for d in dets], dtype=np.float64),
            np.stack([d.landmarks for d in dets]))
