"""What the service accepts: its limits (`ServeLimits`), the image header check made before any decoding, and
bearer-token auth. Every refusal is an `HttpRefusal` the app turns into a JSON error with its status."""

from __future__ import annotations

import hmac
import io
import ipaddress
import os
import warnings
from dataclasses import dataclass

from PIL import Image, UnidentifiedImageError

from gpen_tune.imageio import EXT_TO_FORMAT, FORMAT_TO_EXT

TOKEN_ENV = "GPEN_TUNE_TOKEN"


@dataclass(frozen=True)
class ServeLimits:
    """Bounds of one server; every one is a CLI option of `gpen-tune serve`."""

    max_upload_bytes: int = 50 * 2**20      # 413 above
    max_pixels: int = 40_000_000            # 413 above, read from the file's header
    max_queue_faces: int = 256              # 503 (Retry-After) when more faces wait for the generator
    request_timeout_s: float = 120.0        # 504 when a request takes longer
    max_wait_ms: float = 5.0                # how long the oldest queued face waits for others to share its batch
    generator_calls: int | None = None      # generator calls at once (None: Steps.generator_calls' default)
    request_threads: int = 40               # threads running requests' steps (a request holds one while detecting)
    request_processes: int = 0              # processes running requests' steps beside the generator's (0: none;
                                            # `gpen-tune serve` asks `default_request_processes`)
    shared_detector: bool = False           # with request processes: one detector process for all of them
    spool_quota_bytes: int = 2 * 2**30      # 507 for a new job above it
    job_expiry_s: float = 24 * 3600.0       # finished jobs (and their files) are removed after this

    def __post_init__(self) -> None:
        if self.request_threads < 1:
            raise ValueError(f"--request-threads {self.request_threads}: use 1 or more")
        if self.request_processes < 0:
            raise ValueError(f"--request-processes {self.request_processes}: use 0 (this process's threads) or more")
        if self.shared_detector and not self.request_processes:
            raise ValueError("--shared-detector detects for the request processes: it needs --request-processes N "
                             "(N >= 1); without them the server's own detector is already shared "
                             "(--detector-process)")


# `serve --request-processes` on a GPU: 4 served 239.0 / 237.6 faces/s (p99 0.48 / 0.54 s) against 191.2 / 176.2
# (p99 0.62 / 0.61 s) for one detector process, 6 served 219.1, 8 ran an H100 out of memory (each process holds
# ~6.4 GiB beside the generator's ~27 GiB at batch 64): benchmarks/RESULTS.md, "Service".
REQUEST_PROCESSES_ON_GPU = 4
REQUEST_PROCESSES_MIN_GPU_BYTES = 64 * 2**30


def default_request_processes(device: object) -> int:
    """`serve --request-processes` when not given: 4 on a GPU with 64 GiB or more for this process, else 0 (the
    server's own threads; on the CPU the generator is the work and a process per request adds nothing)."""
    from gpen_tune.device_memory import cuda_total  # heavy: torch (the CLI's --help stays fast)

    total = cuda_total(device)
    return REQUEST_PROCESSES_ON_GPU if total is not None and total >= REQUEST_PROCESSES_MIN_GPU_BYTES else 0


SHARED_MEMORY_DIR = "/dev/shm"       # where POSIX shared memory lives on Linux (a container's is 64 MiB by default)


def shared_memory_free() -> int | None:
    """The free bytes of /dev/shm (None where there is none)."""
    try:
        stat = os.statvfs(SHARED_MEMORY_DIR)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def request_shared_memory_bytes(size: int, queue_faces: int) -> int:
    """What the request processes may hold in /dev/shm at once: the queued faces (`--max-queue-faces`) and as many
    again in the generator's batch and in requests being finished, each `size` x `size` x 3 bytes."""
    return 2 * queue_faces * size * size * 3


def shared_memory_shortfall(size: int, queue_faces: int, free: int | None = None) -> str | None:
    """Why /dev/shm cannot carry the request processes' faces, or None when it can (or there is none to check).

    A request's crops and restored faces live in a segment there from `prepare` to `finish`
    (`request_shared_memory_bytes` in all). A segment written beyond what /dev/shm holds kills its process
    (SIGBUS), so this is checked before the server starts. `free`: the free bytes (None: read from the file
    system)."""
    free = shared_memory_free() if free is None else free
    if free is None:
        return None
    need = request_shared_memory_bytes(size, queue_faces)
    if free >= need:
        return None
    return (f"{SHARED_MEMORY_DIR} has {free / 2**20:.0f} MiB free and request processes need about "
            f"{need / 2**20:.0f} MiB there ({queue_faces} queued faces of {size} px, twice over)")


class HttpRefusal(Exception):
    """A request refused with `status` and a one-line `message` (and optional headers)."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


def image_header(data: bytes, name: str) -> tuple[str, int, int] | None:
    """(Pillow format, width, height) from the file's header alone (Pillow opens lazily: no pixel is decoded);
    None when Pillow does not take it for an image. 413 when the header claims a decompression bomb."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as img:
                return img.format, img.size[0], img.size[1]
    except Image.DecompressionBombError as e:
        raise HttpRefusal(413, f"{name}: {e}") from None
    except (UnidentifiedImageError, OSError, ValueError):
        return None


def check_header(data: bytes, name: str, max_pixels: int) -> str:
    """The upload's file extension, checked from its header before any decoding. 415: not an image or a format
    we do not restore; 413: more pixels than `max_pixels`."""
    header = image_header(data, name)
    if header is None:
        raise HttpRefusal(415, f"{name}: not an image (or a format that cannot be read); send JPEG, PNG, WebP, "
                          "BMP or TIFF")
    fmt, w, h = header
    if fmt not in FORMAT_TO_EXT:
        raise HttpRefusal(415, f"{name}: {fmt} is not supported; send JPEG, PNG, WebP, BMP or TIFF")
    if w * h > max_pixels:
        raise HttpRefusal(413, f"{name}: {w}x{h} is {w * h / 1e6:.1f} megapixels, above this server's limit of "
                          f"{max_pixels / 1e6:.1f}")
    return FORMAT_TO_EXT[fmt]


def check_ext(ext: str | None, allowed: tuple[str, ...] = tuple(EXT_TO_FORMAT)) -> str | None:
    """The output format asked for, one of `allowed` (photo formats; a video job's: video containers)."""
    if ext is None or ext == "":
        return None
    e = ext.lower().lstrip(".")
    if e not in allowed:
        raise HttpRefusal(400, f"ext={ext}: use one of {', '.join(allowed)}")
    return e


def token_matches(header: str | None, token: str) -> bool:
    """`Authorization: Bearer <token>`, compared in constant time."""
    if not header or not header.startswith("Bearer "):
        return False
    return hmac.compare_digest(header[len("Bearer "):].strip().encode(), token.encode())


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps the server reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
