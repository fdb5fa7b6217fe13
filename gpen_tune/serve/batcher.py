"""`FaceBatcher`: one queue of faces from every request, and `workers` threads (one on a GPU) that restore them in
shared generator calls.

A request's faces are queued together (`submit` gives a `Ticket`, done when its last face is restored). A
worker waits at most `max_wait_s` after the oldest queued face for more to arrive, or until a full batch is
there, then takes as many as the restorer's bucket policy says (`Steps.take`) and makes one `Steps.restore` call
for them, whichever requests they come from. With several workers (the CPU: `Steps.generator_calls`) that many
generator calls run at once, each on its own share of the cores. A ticket that is cancelled (client gone,
timeout) has its queued faces dropped; the queue holds at most `max_queue` faces (`QueueFull` beyond: the HTTP
layer answers 503).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field

from gpen_tune.serve.steps import FaceRef, Prepared, Steps


class QueueFull(RuntimeError):
    """More faces are waiting than the server takes; retry later."""


@dataclass
class Ticket:
    """One request's faces in the queue; `future` resolves (None) when all are restored, or with the error."""

    prepared: Prepared
    remaining: int
    future: Future = field(default_factory=Future)
    cancelled: bool = False


@dataclass
class BatchStats:
    """What the worker did: generator calls, faces restored, faces dropped (cancelled tickets), faces waiting."""

    calls: int = 0
    faces: int = 0
    dropped: int = 0
    queued: int = 0


class FaceBatcher:
    def __init__(self, steps: Steps, max_wait_s: float = 0.005, max_queue: int = 256,
                 on_batch: Callable[[int, float], None] | None = None, workers: int = 1):
        if workers < 1:
            raise ValueError(f"the batcher needs at least one worker, got {workers}")
        self.steps = steps
        self.max_wait_s = max_wait_s
        self.max_queue = max_queue
        self.on_batch = on_batch                  # (faces, seconds) after every generator call
        self.stats = BatchStats()
        self._queue: deque[tuple[Ticket, int, float]] = deque()   # (ticket, face index, arrival time)
        self._cond = threading.Condition()
        self._stopping = False
        self._threads = [threading.Thread(target=self._run, name=f"gpen-serve-batcher-{i}", daemon=True)
                         for i in range(workers)]
        for thread in self._threads:
            thread.start()

    @property
    def workers(self) -> int:
        """Generator calls that may run at once."""
        return len(self._threads)

    def submit(self, prepared: Prepared) -> Ticket:
        """Queue every face of one image; a ticket without faces is done at once."""
        ticket = Ticket(prepared, len(prepared.crops))
        if ticket.remaining == 0:
            ticket.future.set_result(None)
            return ticket
        now = time.perf_counter()
        with self._cond:
            if self._stopping:
                raise QueueFull("the server is shutting down")
            if len(self._queue) + ticket.remaining > self.max_queue:
                raise QueueFull(f"{len(self._queue)} faces are waiting (the limit is {self.max_queue})")
            self._queue.extend((ticket, k, now) for k in range(ticket.remaining))
            self.stats.queued = len(self._queue)
            self._cond.notify()
        return ticket

    def cancel(self, ticket: Ticket) -> None:
        """Drop the ticket's faces that are still queued (a face already in a generator call completes)."""
        with self._cond:
            if ticket.cancelled or ticket.future.done():
                return
            ticket.cancelled = True
            before = len(self._queue)
            self._queue = deque(e for e in self._queue if e[0] is not ticket)
            self.stats.dropped += before - len(self._queue)
            self.stats.queued = len(self._queue)
        if not ticket.future.done():
            ticket.future.cancel()

    def close(self) -> None:
        """Restore what is queued, then stop the workers."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join()

    # -- the worker ----------------------------------------------------------------------------------------------
    def _next_batch(self) -> list[tuple[Ticket, int]] | None:
        """Wait for faces, then for a full batch or the oldest face's deadline; None once stopping and empty."""
        with self._cond:
            while not self._queue:
                if self._stopping:
                    return None
                self._cond.wait()
            limit = self.steps.limit
            while len(self._queue) < limit and not self._stopping:
                left = self._queue[0][2] + self.max_wait_s - time.perf_counter()
                if left <= 0:
                    break
                self._cond.wait(left)
                if not self._queue:               # all cancelled while waiting
                    return []
            n = self.steps.take(min(len(self._queue), limit))
            batch = [self._queue.popleft()[:2] for _ in range(n)]
            self.stats.queued = len(self._queue)
            return batch

    def _run(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            if batch:
                self._restore(batch)

    def _restore(self, batch: list[tuple[Ticket, int]]) -> None:
        faces: list[FaceRef] = [(t.prepared, k) for t, k in batch]
        t0 = time.perf_counter()
        try:
            self.steps.restore(faces)
        except Exception as exc:                  # the batch's requests fail; the service goes on
            for ticket, _ in batch:
                _settle(ticket.future, exc)
            return
        seconds = time.perf_counter() - t0
        if self.on_batch is not None:
            self.on_batch(len(batch), seconds)
        with self._cond:                          # another worker may restore other faces of the same tickets
            self.stats.calls += 1
            self.stats.faces += len(batch)
            done = []
            for ticket, _ in batch:
                ticket.remaining -= 1
                if ticket.remaining == 0:
                    done.append(ticket)
        for ticket in done:
            _settle(ticket.future, None)


def _settle(future: Future, error: BaseException | None) -> None:
    """Resolve a ticket's future unless it was cancelled meanwhile (by the request's thread)."""
    try:
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)
    except InvalidStateError:
        pass
