"""`RequestProcesses`: the server's side of `gpen-tune serve --request-processes N` (the child's side, and why, is
`gpen_tune.serve.request_child`).

Each request goes to the process with the fewest requests in flight, and comes back to it for `finish` (the
process holds the decoded image between the two). `prepare` answers a `Handed`: the request's crops as views of
the process's shared-memory segment, which the batcher reads like a `Prepared`'s; `finish` first copies the
restored faces back into the segment. A process that exits fails the requests it held (500) and the server
reports itself not ready (503 on /readyz), so that whoever runs it restarts it.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import threading
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import numpy as np

from gpen_tune.child_process import detach, rebuilt
from gpen_tune.face.detect.host import DetectorHost
from gpen_tune.face.detect.process import DetectorSpec
from gpen_tune.serve.request_child import RequestSpec, serve_requests
from gpen_tune.serve.steps import RequestOptions

START_TIMEOUT_S = 300.0         # spawn + import torch + build the detector (+ CUDA context) must fit in this
STOP_TIMEOUT_S = 30.0           # close(): how long a process may take to finish its requests and exit


class RequestProcessError(RuntimeError):
    """A request process failed to start, exited, or raised what could not be sent back."""


@dataclass
class Handed:
    """One upload prepared in a request process: its crops (views of the process's segment) and the fields the
    batcher fills (`restored`), as on a `Prepared`."""

    child: _Child
    key: int
    shm: SharedMemory | None
    crops: list[np.ndarray]
    faces: int
    timings: dict[str, float]
    restored: list[np.ndarray | None] = field(default_factory=list)
    finished: bool = False
    stages = None                   # parse masks are made in the request process
    on_device = False               # ... and so is the paste

    def add_time(self, step: str, seconds: float) -> None:
        self.timings[step] = self.timings.get(step, 0.0) + seconds


class RequestProcesses:
    """`processes` request processes; with `detector` one detector process (a `DetectorHost`) detects for all of
    them, their images batched together, else each has a detector of its own."""

    def __init__(self, spec: RequestSpec, processes: int, detector: DetectorSpec | None = None):
        if processes < 1:
            raise ValueError(f"--request-processes {processes}: use 1 or more (0 works in the server's threads)")
        ctx = mp.get_context("spawn")
        self.size = spec.size
        self.host = None if detector is None else DetectorHost(detector, processes)
        conns = [None] * processes if self.host is None else self.host.client_conns
        self._children = [_Child(ctx, spec, i, conn) for i, conn in enumerate(conns)]   # started side by side
        if self.host is not None:
            self.host.release_client_ends()
        self._keys = itertools.count(1)
        self._lock = threading.Lock()

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        for child in self._children:
            child.wait_ready(timeout_s)
            child.start_reading(self)

    @property
    def processes(self) -> list[Any]:
        return [c.process for c in self._children]

    def exited(self) -> str | None:
        """Why the service cannot go on (a request process or the shared detector exited), or None."""
        for i, child in enumerate(self._children):
            if child.dead:
                return f"request process {i} exited (code {child.process.exitcode}): restart the server"
        if self.host is not None and self.host.process.exitcode is not None:
            return f"the shared detector process exited (code {self.host.process.exitcode}): restart the server"
        return None

    # -- a request's two calls ----------------------------------------------------------------------------------
    def prepare(self, data: bytes, name: str, ext: str, options: RequestOptions) -> Future:
        """Decode, detect, align and cut the upload in the least busy process; the future gives a `Handed`."""
        with self._lock:
            live = [c for c in self._children if not c.dead]
            if not live:
                raise RequestProcessError(self.exited() or "no request process is running")
            child = min(live, key=lambda c: c.in_flight)
            child.in_flight += 1
        return child.call("prepare", next(self._keys), data, name, ext, options)

    def finish(self, handed: Handed, ext: str | None) -> Future:
        """The restored faces back into the segment, then paste and encode there; the future gives (the encoded
        image, its extension, the request's timings)."""
        if handed.shm is not None:
            rows = np.ndarray((len(handed.restored), self.size, self.size, 3), np.uint8, buffer=handed.shm.buf)
            for k, face in enumerate(handed.restored):
                rows[k] = face
            del rows
        self._unmap(handed)
        handed.finished = True
        return handed.child.call("finish", handed.key, ext)

    def release(self, handed: Handed) -> None:
        """The request is over: its process forgets it, unless `finish` was asked (whose answer ends it)."""
        self._unmap(handed)
        if not handed.finished:
            handed.child.send("drop", handed.key)
            self.ended(handed.child)

    def ended(self, child: _Child) -> None:
        """One request of `child` is over (answered with an error, finished, or dropped)."""
        with self._lock:
            child.in_flight -= 1

    @staticmethod
    def _unmap(handed: Handed) -> None:
        handed.crops, handed.restored = [], []
        detach(handed.shm)
        handed.shm = None

    def close(self) -> None:
        """Ask every process to finish and exit; one that does not within STOP_TIMEOUT_S is terminated."""
        for child in self._children:
            child.send("close", 0)
        for child in self._children:
            child.process.join(STOP_TIMEOUT_S)
            if child.process.is_alive():
                child.process.terminate()
                child.process.join(5.0)
            child.conn.close()
        if self.host is not None:                          # it exits once every request process has gone
            self.host.close()


class _Child:
    """One request process: its pipe, the futures of its requests by key, and the thread that reads its answers."""

    def __init__(self, ctx: Any, spec: RequestSpec, index: int, detector_conn: Any = None):
        self.conn, child_conn = ctx.Pipe()
        self.process = ctx.Process(target=serve_requests, args=(spec, child_conn, detector_conn), daemon=True,
                                   name=f"gpen-request-process-{index}")
        self.process.start()
        child_conn.close()               # only the child holds its end: its death reads as EOF here
        self.size = spec.size
        self.in_flight = 0
        self.dead = False
        self._futures: dict[int, Future] = {}
        self._lock = threading.Lock()

    def wait_ready(self, timeout_s: float) -> None:
        try:
            if not self.conn.poll(timeout_s):
                raise RequestProcessError(f"a request process did not start within {timeout_s:.0f} s")
            kind, _, payload = self.conn.recv()
        except (EOFError, OSError):
            self.process.join(1.0)
            raise RequestProcessError(f"a request process exited (code {self.process.exitcode}) before it was "
                                      "ready") from None
        if kind == "error":
            raise rebuilt(payload, RequestProcessError)

    def start_reading(self, owner: RequestProcesses) -> None:
        threading.Thread(target=self._read, args=(owner,), name=self.process.name + "-answers", daemon=True).start()

    def call(self, kind: str, key: int, *args: Any) -> Future:
        future: Future = Future()
        with self._lock:
            if self.dead:
                future.set_exception(RequestProcessError(f"{self.process.name} exited"))
                return future
            self._futures[key] = future
            self.conn.send((kind, key, *args))
        return future

    def send(self, kind: str, key: int) -> None:
        with self._lock:
            if not self.dead:
                self.conn.send((kind, key))

    def _read(self, owner: RequestProcesses) -> None:
        while True:
            try:
                kind, key, payload = self.conn.recv()
            except (EOFError, OSError):
                break
            with self._lock:
                future = self._futures.pop(key, None)
            if future is None:
                continue
            if kind == "prepared":
                handed = self._handed(key, *payload)
                if not _settle(future, handed):            # the request went away meanwhile
                    owner.release(handed)
                continue
            owner.ended(self)                              # an error or a finish: the process let it go
            if kind == "error":
                _settle(future, error=rebuilt(payload, RequestProcessError))
            else:                                          # "finished": (encoded image, extension, timings)
                _settle(future, payload)
        with self._lock:
            self.dead = True
            futures, self._futures = list(self._futures.values()), {}
        self.process.join(5.0)
        for future in futures:
            _settle(future, error=RequestProcessError(f"{self.process.name} exited (code {self.process.exitcode}) "
                                                      "while it held this request"))

    def _handed(self, key: int, name: str | None, n: int, faces: int, timings: dict) -> Handed:
        shm = None if name is None else SharedMemory(name=name)
        crops = [] if shm is None else list(np.ndarray((n, self.size, self.size, 3), np.uint8, buffer=shm.buf))
        return Handed(self, key, shm, crops, faces, timings, [None] * n)


def _settle(future: Future, result: Any = None, error: BaseException | None = None) -> bool:
    """Resolve `future` unless it was cancelled meanwhile; whether it was resolved."""
    try:
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)
        return True
    except InvalidStateError:
        return False
