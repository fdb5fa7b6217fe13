"""What a parent and the children it spawns (the detector processes, the service's request processes) share:
exceptions sent back through a pipe, and shared-memory segments unmapped safely."""

from __future__ import annotations

import contextlib
import gc
import pickle
from collections.abc import Callable
from multiprocessing.shared_memory import SharedMemory


def pickled(exc: BaseException) -> bytes | str:
    """The exception as bytes for the pipe, or its text when it cannot be pickled and rebuilt."""
    try:
        data = pickle.dumps(exc)
        pickle.loads(data)                      # some exceptions pickle but cannot be rebuilt
        return data
    except Exception:  # noqa: BLE001 - fall back to the text
        return f"{type(exc).__name__}: {exc}"


def rebuilt(payload: bytes | str, error: Callable[[str], BaseException]) -> BaseException:
    """The child's exception from `pickled`; `error(text)` when it came as text or cannot be rebuilt here."""
    if isinstance(payload, bytes):
        try:
            return pickle.loads(payload)
        except Exception:  # noqa: BLE001 - an exception class this process cannot rebuild
            return error("the child process raised an exception that could not be rebuilt")
    return error(payload)


def detach(shm: SharedMemory | None) -> None:
    """Unmap a segment (its owner unlinks it); a view still alive somewhere only delays the unmapping."""
    if shm is None:
        return
    try:
        shm.close()
    except BufferError:
        gc.collect()
        with contextlib.suppress(BufferError):
            shm.close()
