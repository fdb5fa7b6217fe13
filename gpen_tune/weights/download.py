"""Stream a file over HTTP(S) into place: temp file, progress bar, timeouts, retries, Range resume, sha256, rename.

Plain `urllib` (no extra dependency). The bytes go to `<dest>.part` next to `dest` (the download's own temp
place, and nowhere else: `dest` must be a file name, never a folder); only a complete file whose sha256 (and
optional `validate` hook) passed is moved onto `dest` with `os.replace`, so `dest` never holds a partial or
unverified file. A failure no retry can fix, a hash mismatch or a rejected file deletes the `.part`; one left by
a transient failure is resumed with an HTTP Range request next time (or restarted cleanly when the server ignores
Range). `download_into` is the entry point for "this URL's file in that cache folder".
"""

from __future__ import annotations

import errno
import hashlib
import http.client
import os
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

CHUNK = 1 << 20                      # bytes per read; also the progress granularity
STALL_BYTES = 1024                   # a transfer that brings fewer bytes in `timeout` seconds has stalled
BACKOFF_S = 1.0                      # first retry waits this long, then doubles
USER_AGENT = "gpen-tune (+https://github.com/yangxy/GPEN weights fetcher)"
FATAL_STATUS = {400, 401, 403, 404, 410, 451}   # retrying cannot help


class DownloadError(RuntimeError):
    """A download that failed for good; the one-line message names the URL and the destination."""


class ChecksumError(DownloadError):
    """The downloaded bytes do not have the expected sha256; nothing was written to dest."""

    def __init__(self, msg: str, expected: str, got: str):
        super().__init__(msg)
        self.expected = expected
        self.got = got


class _Transient(Exception):
    """One failed attempt that a retry may fix (reset, timeout, 5xx, truncated body)."""


class _Fatal(Exception):
    """A failure no retry can fix (404, 403, no route to the host)."""


@dataclass(frozen=True)
class Downloaded:
    path: Path
    sha256: str
    size: int


def download(
    url: str,
    dest: Path,
    *,
    sha256: str | None = None,
    timeout: float = 30.0,
    retries: int = 3,
    progress: bool = True,
    validate: Callable[[Path], None] | None = None,
    backoff: float = BACKOFF_S,
    console=None,
) -> Path:
    """Download `url` to `dest` atomically; see `download_file` for the arguments. Returns `dest`."""
    return download_file(url, dest, sha256=sha256, timeout=timeout, retries=retries, progress=progress,
                         validate=validate, backoff=backoff, console=console).path


def url_filename(url: str) -> str:
    """The file name a URL ends in (percent-decoded); DownloadError when it names none (a folder URL)."""
    name = urllib.parse.unquote(urllib.parse.urlparse(url).path).rsplit("/", 1)[-1]
    try:
        return plain_filename(name, what=url)
    except DownloadError:
        raise DownloadError(f"{url}: the URL names no file (it ends in {name or '/'!r}); give the URL of the file "
                            f"itself, or a file name to save it as") from None


def plain_filename(name: str, what: str = "file name") -> str:
    """`name` when it is one plain file name (not empty, '.', '..', no slash or NUL), else DownloadError."""
    if not name or name in (".", "..") or any(c in name for c in "/\\\0"):
        raise DownloadError(f"{what}: {name!r} is not a plain file name; nothing was downloaded")
    return name


def download_into(
    folder: Path,
    url: str,
    filename: str | None = None,
    *,
    sha256: str | None = None,
    timeout: float = 30.0,
    retries: int = 3,
    progress: bool = True,
    validate: Callable[[Path], None] | None = None,
    backoff: float = BACKOFF_S,
) -> Path:
    """`folder/filename` (default: the URL's file name), downloaded once: an existing file is returned as it is.

    The name is checked to be one plain file name, so the file and its `.part` always stay inside `folder`.
    Raises DownloadError (one line naming the URL and the destination).
    """
    name = plain_filename(filename, what=f"file name for {url}") if filename is not None else url_filename(url)
    dest = Path(folder) / name
    if dest.is_file():
        return dest
    return download_file(url, dest, sha256=sha256, timeout=timeout, retries=retries, progress=progress,
                         validate=validate, backoff=backoff).path


def download_file(
    url: str,
    dest: Path,
    *,
    sha256: str | None = None,
    timeout: float = 30.0,
    retries: int = 3,
    progress: bool = True,
    validate: Callable[[Path], None] | None = None,
    backoff: float = BACKOFF_S,
    console=None,
) -> Downloaded:
    """Download `url` to `dest` and return its path, sha256 and size.

    Args:
        url: http(s) URL (a Range-capable server lets an interrupted download resume).
        dest: final path; written only once the whole file is verified.
        sha256: expected hex digest; a mismatch raises ChecksumError and deletes the temp file.
        timeout: seconds for connecting and for each read.
        retries: extra attempts after the first for transient failures (reset, timeout, 5xx, truncated body),
            waiting `backoff`, 2*`backoff`, ... seconds in between. 403/404 fail at once.
        progress: show a Rich progress bar (bytes, speed, ETA) on stderr, or on `console` when given.
        validate: called with the complete temp file before it is accepted; raising rejects the file.
    Raises:
        DownloadError (ChecksumError for a hash mismatch), one line naming the URL and dest.
    """
    dest = Path(dest)
    plain_filename(dest.name, what=f"destination {dest}")
    if dest.is_dir():
        raise DownloadError(f"{dest}: is a directory; give the path of the file to write: {url}")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DownloadError(f"cannot create {dest.parent} ({_one_line(e)}): {url} -> {dest}") from None
    part = dest.with_name(dest.name + ".part")
    expected = sha256.strip().lower() if sha256 else None
    where = f"{url} -> {dest}"
    try:
        with _folder_lock(dest.parent), _ProgressBar(dest.name, enabled=progress, console=console) as bar:
            if expected and dest.is_file() and file_sha256(dest) == expected:
                return Downloaded(dest, expected, dest.stat().st_size)  # another process fetched it meanwhile
            digest, size = _fetch_part(url, part, where, timeout, retries, backoff, bar)
            _accept_part(part, where, expected, digest, validate)
            os.replace(part, dest)
    except OSError as e:  # a local write failed (disk full, read-only folder): no retry can fix that
        part.unlink(missing_ok=True)
        raise DownloadError(f"cannot write {getattr(e, 'filename', None) or part} ({e.strerror or _one_line(e)}); "
                            f"nothing was saved: {where}") from None
    return Downloaded(dest, digest, size)


def _fetch_part(url: str, part: Path, where: str, timeout: float, retries: int, backoff: float,
                bar: _ProgressBar) -> tuple[str, int]:
    """Fill `part` with the whole body, retrying transient failures; returns (sha256, size)."""
    last = "no attempt made"
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(backoff * 2 ** (attempt - 1))
        try:
            return _attempt(url, part, timeout, bar)
        except _Transient as e:
            last = str(e)
        except _Fatal as e:
            raise DownloadError(f"{e}: {where}") from None
    kept = f"; partial data kept in {part.name} to resume" if part.exists() and part.stat().st_size else ""
    raise DownloadError(f"download failed after {retries + 1} attempts ({last}): {where}{kept}")


def _accept_part(part: Path, where: str, expected: str | None, digest: str,
                 validate: Callable[[Path], None] | None) -> None:
    """Delete `part` and raise unless its sha256 and the `validate` hook accept it."""
    if expected and digest != expected:
        part.unlink(missing_ok=True)
        raise ChecksumError(f"sha256 mismatch, file refused and deleted: expected {expected}, got {digest}: "
                            f"{where}", expected=expected, got=digest)
    if validate is not None:
        try:
            validate(part)
        except Exception as e:
            part.unlink(missing_ok=True)
            raise DownloadError(f"downloaded file rejected ({_one_line(e)}): {where}") from None


@contextmanager
def _folder_lock(folder: Path) -> Iterator[None]:
    """Serialise downloads into one folder across processes (flock on the folder; a no-op where unsupported),
    so two runs fetching the same weights never write into the same `.part` at once."""
    try:
        import fcntl  # optional: fcntl (POSIX only)
    except ImportError:  # Windows: no flock
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            pass  # a filesystem without flock support: carry on unlocked
        yield
    finally:
        os.close(fd)  # releases the lock


def file_sha256(path: Path, chunk: int = CHUNK) -> str:
    """Hex sha256 of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------------------------


def _attempt(url: str, part: Path, timeout: float, bar: _ProgressBar) -> tuple[str, int]:
    """One request: resume `part` when it has bytes and the server honours Range; returns (sha256, size)."""
    have = part.stat().st_size if part.exists() else 0
    req = urllib.request.Request(url, headers={"User-Agent": USER_AGENT, "Accept-Encoding": "identity"})
    if have:
        req.add_header("Range", f"bytes={have}-")
    try:
        resp = urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as e:
        e.close()
        if e.code == 416 and have:  # our partial file is longer than the server's: start again at once
            part.unlink(missing_ok=True)
            return _attempt(url, part, timeout, bar)
        if e.code in FATAL_STATUS:
            part.unlink(missing_ok=True)
            raise _Fatal(f"HTTP {e.code} {e.reason}") from None
        raise _Transient(f"HTTP {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        reason = e.reason
        if isinstance(reason, socket.gaierror) or getattr(reason, "errno", None) in (errno.ENETUNREACH,
                                                                                        errno.EHOSTUNREACH):
            raise _Fatal(f"cannot reach the server (offline?): {_one_line(reason)}") from None
        raise _Transient(f"connection failed: {_one_line(reason)}") from None
    except (TimeoutError, ConnectionError, http.client.HTTPException, OSError) as e:
        raise _Transient(f"connection failed: {_one_line(e)}") from None

    with resp:
        status = getattr(resp, "status", 200)
        total = _int_or_none(resp.headers.get("Content-Length"))
        h = hashlib.sha256()
        if have and status == 206 and _range_start(resp.headers.get("Content-Range")) == have:
            with open(part, "rb") as f:  # the digest must cover the bytes we already have
                while block := f.read(CHUNK):
                    h.update(block)
            mode, done = "ab", have
        else:
            mode, done = "wb", 0      # fresh start, or the server ignored Range: clean restart
        expected_size = None if total is None else done + total
        bar.start(done, expected_size)
        with open(part, mode) as f:
            done = _copy(resp, f, h, done, bar, timeout)
            f.flush()
            os.fsync(f.fileno())
    if expected_size is not None and done < expected_size:
        raise _Transient(f"truncated transfer: {done} of {expected_size} bytes")
    return h.hexdigest(), done


def _copy(resp, f: IO[bytes], h, done: int, bar: _ProgressBar, timeout: float) -> int:
    """Body -> `f`. A failed read is transient, and so is a stall (fewer than STALL_BYTES in `timeout` seconds:
    the socket's own timeout counts only silence, so a server that sends a byte now and then would hold the
    download for ever); a failed write (disk full) is an OSError for the caller."""
    window_start, window_bytes = time.monotonic(), 0
    while True:
        try:
            block = resp.read1(CHUNK)
        except http.client.IncompleteRead as e:
            f.write(e.partial)
            raise _Transient(f"truncated transfer after {done + len(e.partial)} bytes") from None
        except (TimeoutError, ConnectionError, OSError) as e:
            raise _Transient(f"read failed after {done} bytes: {_one_line(e)}") from None
        if not block:
            return done
        f.write(block)
        h.update(block)
        done += len(block)
        bar.advance(len(block))
        window_bytes += len(block)
        if time.monotonic() - window_start >= timeout:
            if window_bytes < STALL_BYTES:
                raise _Transient(f"stalled: {window_bytes} bytes in {timeout:g} s after {done} bytes")
            window_start, window_bytes = time.monotonic(), 0


def _range_start(content_range: str | None) -> int | None:
    """Start offset of 'bytes START-END/TOTAL', else None."""
    if not content_range or not content_range.startswith("bytes "):
        return None
    try:
        return int(content_range[6:].split("-", 1)[0])
    except ValueError:
        return None


def _int_or_none(v: str | None) -> int | None:
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def _one_line(e: object) -> str:
    s = str(e).strip().splitlines()
    return s[0] if s else type(e).__name__


class _ProgressBar:
    """Rich bar with bytes, speed and ETA, shown from the first response on; a no-op when disabled."""

    def __init__(self, label: str, enabled: bool, console=None):
        self.enabled = enabled
        self.label = label
        self.console = console
        self._progress = None
        self._task = None

    def __enter__(self) -> _ProgressBar:
        return self

    def start(self, done: int, total: int | None) -> None:
        if not self.enabled:
            return
        if self._progress is None:
            from rich.console import Console  # heavy: rich progress, only on a terminal download
            from rich.progress import (  # heavy: rich progress, only on a terminal download
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            self._progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                TextColumn("eta"), TimeRemainingColumn(),
                console=self.console or Console(stderr=True),
            )
            self._progress.start()
            self._task = self._progress.add_task(self.label, total=total, completed=done)
        else:
            self._progress.reset(self._task, total=total, completed=done)

    def advance(self, n: int) -> None:
        if self._progress is not None:
            self._progress.advance(self._task, n)

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()
