"""A request process of `gpen-tune serve --request-processes N`: the child's side.

Why: one server process carries every request's Python work (HTTP, decode, detection, align, paste, encode) under
one GIL; on a GPU that, not the generator, bounded the faces/s (benchmarks/RESULTS.md, "Service"). A request
process runs `prepare` and `finish` of `gpen_tune.serve.steps` for the requests the server hands it, on its own
threads, its own GIL and its own detector; the server keeps the generator and batches every process's faces.

Through the pipe go the upload and its options in, the name of a shared-memory segment out, then the encoded
result out: the server's threads make two hops per request (send the upload, send the restored faces) and touch no
file. The segment holds the request's crops [N, S, S, 3] uint8; the server reads them into its batch and writes
the restored faces back over them, then asks for `finish`. This process creates and unlinks every segment, and
writes each request's files in a folder of its own under the server's request folder.
"""

from __future__ import annotations

import shutil
import signal
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpen_tune.child_process import detach, pickled
from gpen_tune.face.detect.process import ProcessDetector
from gpen_tune.imageio import ImageReadError
from gpen_tune.pipeline.api import Pipeline
from gpen_tune.pipeline.settings import EnhanceSettings
from gpen_tune.serve.steps import Prepared, RequestOptions, Steps
from gpen_tune.tune.options import TuneConfig


@dataclass(frozen=True)
class RequestSpec:
    """What a request process needs to build its steps (picklable: settings, never networks)."""

    settings: EnhanceSettings       # the server's, with the detector on a thread of the request process
    tune: TuneConfig
    device: str
    size: int                       # the generator's crop size
    threads: int                    # requests this process works on at once
    torch_threads: int | None       # on the CPU: torch's threads for its detector (one share of the cores)
    work_dir: str                   # where each request's upload and result are written (the server's)

    @classmethod
    def of(cls, steps: Steps, threads: int, work_dir: Path) -> RequestSpec:
        pipe = steps.pipeline
        settings = replace(pipe.settings, detector_process=False, detector_processes=1)
        cpu = steps.device.type == "cpu"
        return cls(settings, pipe.tune, str(steps.device), pipe.size, threads,
                   steps.cpu_threads() if cpu else None, str(work_dir))

    def build(self, detector_conn: Any = None) -> Steps:
        """The service's steps without a generator: the detector (with `detector_conn`, the server's shared
        detector process over that pipe), the parser and the paste of the server's settings, warmed by one
        detection."""
        detector = None if detector_conn is None else ProcessDetector.attached(detector_conn)
        pipe = Pipeline(self.settings, self.tune, restorer=_CropShape(torch.device(self.device), self.size),
                        detector=detector, cut_on_device=False, warm_detector=False,
                        notify=lambda _: None)                            # the server said it
        steps = Steps(pipe)
        _ = pipe.parser                                   # a missing ParseNet file fails here, before ready
        steps.warm_up_detector()
        return steps


class _CropShape:
    """What the pipeline asks of a restorer in a process without the generator: its device and crop size."""

    model = None
    limit = 0

    def __init__(self, device: torch.device, size: int):
        self.device, self.size = device, size


def serve_requests(spec: RequestSpec, conn: Any, detector_conn: Any = None) -> None:
    """Build the steps, say ready, then work on what the server sends until it says close or goes away.
    `detector_conn`: a pipe to the server's shared detector process (`--shared-detector`), else a detector here."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)         # Ctrl-C is the server's to handle; it closes us
    try:
        if spec.torch_threads:
            torch.set_num_threads(spec.torch_threads)
        steps = spec.build(detector_conn)
    except BaseException as exc:  # noqa: BLE001 - every start failure goes back to the server
        conn.send(("error", 0, pickled(exc)))
        return
    conn.send(("ready", 0, None))
    requests = _Requests(steps, spec, conn)
    try:
        with ThreadPoolExecutor(spec.threads, thread_name_prefix="gpen-request") as pool:
            while True:
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    break                                  # the server died
                if msg[0] == "close":
                    break
                pool.submit(requests.handle, *msg)
    finally:
        requests.close()
        steps.close()


class _Requests:
    """The requests this process holds between `prepare` and `finish`, by the server's key."""

    def __init__(self, steps: Steps, spec: RequestSpec, conn: Any):
        self.steps, self.size, self.work_dir, self.conn = steps, spec.size, Path(spec.work_dir), conn
        self._held: dict[int, tuple[Prepared | None, SharedMemory | None, Path]] = {}
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()

    def handle(self, kind: str, key: int, *args: Any) -> None:
        try:
            if kind == "prepare":
                reply = ("prepared", key, self._prepare(key, *args))
            elif kind == "finish":
                reply = ("finished", key, self._finish(key, *args))
            else:                                          # "drop": the request went away
                self._release(key)
                return
        except BaseException as exc:  # noqa: BLE001 - goes back to its request
            self._release(key)
            reply = ("error", key, pickled(exc))
        with self._send_lock:
            self.conn.send(reply)

    def _prepare(self, key: int, data: bytes, name: str, ext: str,
                 options: RequestOptions) -> tuple[str | None, int, int, dict]:
        folder = Path(tempfile.mkdtemp(dir=self.work_dir))
        with self._lock:
            self._held[key] = (None, None, folder)
        path = folder / f"input.{ext}"
        path.write_bytes(data)
        try:
            prepared = self.steps.prepare(path, name, options)
        except ImageReadError as e:                    # named as the client named it, not by its path here
            raise ImageReadError(" ".join(str(e).split()).replace(str(path), name)) from None
        n = len(prepared.crops)
        shm = SharedMemory(create=True, size=n * self.size * self.size * 3) if n else None
        with self._lock:
            self._held[key] = (prepared, shm, folder)
        if shm is not None:
            self._rows(shm, n)[...] = np.stack(prepared.crops)
        prepared.crops = []
        return (None if shm is None else shm.name), n, prepared.faces, dict(prepared.timings)

    def _finish(self, key: int, ext: str | None) -> tuple[bytes, str, dict]:
        with self._lock:
            prepared, shm, folder = self._held[key]
        if shm is not None:
            self.steps.take_restored(prepared, self._rows(shm, len(prepared.restored)))
        path = self.steps.finish(prepared, folder / "out", ext)
        data = path.read_bytes()
        self._release(key)
        return data, path.suffix.lstrip("."), dict(prepared.timings)

    def _rows(self, shm: SharedMemory, n: int) -> np.ndarray:
        return np.ndarray((n, self.size, self.size, 3), np.uint8, buffer=shm.buf)

    def _release(self, key: int) -> None:
        with self._lock:
            prepared, shm, folder = self._held.pop(key, (None, None, None))
        if prepared is not None:
            prepared.restored, prepared.restored_device = [], []
        if shm is not None:
            detach(shm)
            shm.unlink()
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)

    def close(self) -> None:
        """Requests the server never finished (it closed or died): their segments go."""
        with self._lock:
            keys = list(self._held)
        for key in keys:
            self._release(key)
