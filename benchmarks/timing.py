"""The one timing helper of the scripts in benchmarks/: a window of wall and CPU time, and repeated calls.

    with Stopwatch(device) as sw:          # synchronises the device on entry and exit
        run()
    sw.seconds, sw.thread_cpu_s, sw.process_cpu_s
    run = Stopwatch().start(); ...; run.elapsed()   # a budget over a whole script

    ms = time_calls(fn, device, repeats)   # each call alone: CUDA events on a GPU, perf_counter elsewhere
    ms = queued_calls(fn, device, repeats) # calls queued back to back, no sync between: a busy GPU's steady state
    summary(ms)                            # median, quartiles, relative IQR (the same as `gpen-tune bench`)
    best_seconds(fn, repeats)              # the fastest of `repeats` calls (steady-state cost of a short step)
    with gil_holders(2) as loops: ...      # threads that only hold the GIL (loops[0]: their loops so far)

Device timing is `gpen_tune.bench.measure`'s, so a benchmark and `gpen-tune bench` time a call the same way.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from gpen_tune.bench.measure import summary, sync, time_calls

__all__ = ["Stopwatch", "best_seconds", "gil_holders", "queued_calls", "summary", "sync", "time_calls"]


class Stopwatch:
    """Wall seconds, this thread's and this process's CPU seconds of a `with` block.

    `device`: a CUDA device is synchronised on entry and exit, so queued GPU work is inside the window."""

    def __init__(self, device: torch.device | str | None = None):
        self.device = torch.device(device) if device is not None else None
        self.seconds = self.thread_cpu_s = self.process_cpu_s = 0.0

    def __enter__(self) -> Stopwatch:
        return self.start()

    def start(self) -> Stopwatch:
        """Open the window (what `with` does); for a window that spans a whole script, read with `elapsed()`."""
        if self.device is not None:
            sync(self.device)
        self._start = (time.perf_counter(), time.thread_time(), time.process_time())
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device is not None and exc[0] is None:
            sync(self.device)
        wall, thread, process = self._start
        self.seconds = time.perf_counter() - wall
        self.thread_cpu_s = time.thread_time() - thread
        self.process_cpu_s = time.process_time() - process

    @property
    def ms(self) -> float:
        return self.seconds * 1000.0

    def elapsed(self) -> float:
        """Seconds since the window opened (for budgets checked while it is still open)."""
        return time.perf_counter() - self._start[0]


def bench_device(name: str) -> torch.device:
    """A benchmark's --device: "auto" is CUDA where there is one, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def best_seconds(fn: Callable[[], object], repeats: int) -> float:
    """The fastest of `repeats` calls of `fn`, in seconds."""
    best = float("inf")
    for _ in range(repeats):
        with Stopwatch() as sw:
            fn()
        best = min(best, sw.seconds)
    return best


def queued_calls(fn: Callable[[], object], device: torch.device, repeats: int) -> list[float]:
    """Milliseconds of `repeats` calls queued back to back (CUDA events around each, one sync at the end: the host
    runs ahead, so launch cost hides behind the previous call's GPU work); perf_counter per call elsewhere."""
    if device.type != "cuda":
        return time_calls(fn, device, repeats)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize(device)
    return [start.elapsed_time(end) for start, end in events]


def py_spy() -> str:
    """The py-spy executable: beside this Python (a virtual environment's bin/) or on PATH."""
    import shutil
    import sys
    from pathlib import Path

    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.is_file() else (shutil.which("py-spy") or "py-spy")


@contextmanager
def gil_holders(count: int) -> Iterator[list[int]]:
    """`count` threads running pure-Python loops (they hold the GIL whenever they run, as a server's busy threads
    do) for the `with` block; yields a one-item list counting their loops of 1,000 additions, which the caller may
    reset and read (what the block cost them)."""
    running, loops = threading.Event(), [0]

    def spin() -> None:
        x = 0
        while running.is_set():
            for i in range(1000):
                x += i
            loops[0] += 1

    running.set()
    threads = [threading.Thread(target=spin, daemon=True) for _ in range(count)]
    for t in threads:
        t.start()
    try:
        yield loops
    finally:
        running.clear()
        for t in threads:
            t.join()
