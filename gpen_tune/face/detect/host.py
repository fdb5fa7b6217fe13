"""`DetectorHost`: one detector process serving several other processes at once, their images in one batch.

Why: `gpen-tune serve --request-processes N` gives each request process a detector of its own, which calls on
the few requests that process holds. A GPU detection is mostly host work whose cost hardly grows with the batch
(MTCNN on <= 512 px photos, H100: 18 ms for 1 image, 15 ms for 8, ~30 ms for 32; benchmarks/RESULTS.md,
"Service"), and N detectors are N CUDA contexts that the GPU serves in turns. The host is one process, one
context and one GIL for detection; each round it takes the batch every client has waiting and detects them in
one call.

How: each client holds a `ProcessDetector.attached(conn)`: its own shared-memory segment and one batch in flight,
exactly as with a detector process of its own (`process.py`), so the host's messages are that child's. The host
waits on every client's pipe, reads the batch of each one that has sent, detects all their images at once and
answers each client its part. A client that closes or dies (EOF) is dropped; the host exits when none is left.
The pipes are made here before anything starts: `client_conns[i]` goes to client i when it is spawned, and
`release_client_ends` closes this process's copies afterwards (so that a client's death reads as EOF).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import signal
from multiprocessing.connection import wait
from multiprocessing.shared_memory import SharedMemory
from typing import Any

from gpen_tune.child_process import detach, pickled
from gpen_tune.face.detect.process import (
    STOP_TIMEOUT_S,
    DetectorSpec,
    close_detector,
    detect_requests,
    ready_info,
    start_detector,
    views,
)


class DetectorHost:
    """The host process and the client ends of its pipes (one per client)."""

    def __init__(self, spec: DetectorSpec, clients: int):
        if clients < 1:
            raise ValueError(f"a detector host needs at least one client, got {clients}")
        ctx = mp.get_context("spawn")
        pairs = [ctx.Pipe() for _ in range(clients)]
        self.client_conns = [mine for mine, _ in pairs]
        host_ends = [theirs for _, theirs in pairs]
        self.process = ctx.Process(target=_host_main, args=(spec, host_ends), daemon=True, name="gpen-detect-host")
        self.process.start()
        for conn in host_ends:
            conn.close()                  # only the host holds them now

    def release_client_ends(self) -> None:
        """Close this process's copies of the client ends, once every client has been spawned with its own."""
        for conn in self.client_conns:
            conn.close()

    def close(self) -> None:
        """Wait for the host to exit (it does once every client has closed), else terminate it."""
        self.process.join(STOP_TIMEOUT_S)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(STOP_TIMEOUT_S)


def _host_main(spec: DetectorSpec, conns: list[Any]) -> None:
    """Build the detector, say ready on every pipe, then detect each round's batches until no client is left."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)    # Ctrl-C is the server's to handle; its clients close us
    try:
        detector = start_detector(spec)
    except BaseException as exc:  # noqa: BLE001 - every start failure goes back to every client
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.send(("error", pickled(exc)))
        return
    info = ready_info(detector)
    segments: dict[Any, SharedMemory] = {}
    live = []
    for conn in conns:
        with contextlib.suppress(OSError):
            conn.send(("ready", info))
            live.append(conn)
    try:
        while live:
            round_ = []                                     # (client, its images, its requests' image counts)
            for conn in wait(live):
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    msg = ("close",)                        # the client died
                if msg[0] == "close":
                    live.remove(conn)
                    detach(segments.pop(conn, None))
                    continue
                _, name, layout, counts = msg
                shm = segments.get(conn)
                if shm is None or shm.name != name:         # the client grew its segment
                    detach(shm)
                    shm = segments[conn] = SharedMemory(name=name)
                round_.append((conn, views(shm, layout), counts))
            if round_:
                _answer(detector, round_)
    finally:
        for shm in segments.values():
            detach(shm)
        close_detector(detector)


def _answer(detector: Any, round_: list[tuple[Any, list, list[int]]]) -> None:
    """One detector call for every client's batch; each client gets its requests' answers."""
    images = [img for _, imgs, _ in round_ for img in imgs]
    replies = detect_requests(detector, images, [n for _, _, counts in round_ for n in counts])
    start = 0
    for conn, _, counts in round_:
        with contextlib.suppress(OSError):                  # a client gone meanwhile reads as EOF next round
            conn.send(replies[start:start + len(counts)])
        start += len(counts)
