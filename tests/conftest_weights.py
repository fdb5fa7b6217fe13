"""Helpers for the weights / download / doctor tests: a real HTTP server on 127.0.0.1 and official-layout files.

Not a conftest.py: the test modules import from here.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from functools import cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import torch

from gpen_tune.model.configs import MODELS, GPENConfig
from gpen_tune.weights.checkpoint import synthetic_state_dict

# A process's checkpoints live in the test run's folder (tests/conftest.py makes it, and removes it when the run
# ends): xdist workers and the processes tests start (Ray workers, spawned children) end without atexit.
TEST_FILES_ENV = "GPEN_TUNE_TEST_FILES"


@cache
def _folder() -> Path:
    path = Path(tempfile.mkdtemp(prefix=f"weights-{os.getpid()}-", dir=os.environ.get(TEST_FILES_ENV)))
    atexit.register(shutil.rmtree, path, ignore_errors=True)     # outside a test run
    return path


def remove_files() -> None:
    """Delete the checkpoints this process wrote (tests/conftest.py calls it when the session ends)."""
    if _folder.cache_info().currsize:
        shutil.rmtree(_folder(), ignore_errors=True)
    _folder.cache_clear()
    checkpoint_file.cache_clear()


@cache
def checkpoint_file(model: str | GPENConfig, seed: int = 0) -> Path:
    """A checkpoint in the official layout (plain state dict saved with torch.save), written once per process."""
    cfg = model if isinstance(model, GPENConfig) else MODELS[model].config
    name = model if isinstance(model, str) else f"custom-{cfg.size}-{cfg.channel_multiplier}-{cfg.narrow}"
    path = _folder() / f"{name}-seed{seed}.pth"
    torch.save(synthetic_state_dict(cfg, seed=seed), path)
    return path


def jpeg_file() -> Path:
    """A real JPEG (matplotlib's Grace Hopper sample), i.e. a file that is no checkpoint."""
    from matplotlib import cbook

    path = _folder() / "grace_hopper.jpg"
    if not path.exists():
        with cbook.get_sample_data("grace_hopper.jpg") as f:
            path.write_bytes(f.read())
    return path


# ---------------------------------------------------------------------------------------------------------------


@dataclass
class Route:
    """What the server does for one path.

    Args:
        data: body bytes (None: 404 / `status`).
        status: fixed error status to answer with (e.g. 403, 404, 500).
        fail_first: answer 500 to the first N requests, then serve.
        truncate_first: send Content-Length in full but only half the body on the first N requests.
        range_ok: honour `Range: bytes=N-` with 206 (False: ignore it and send 200 + everything).
        delay: seconds to wait before answering (for timeouts).
        trickle: seconds between single bytes of the body (a network that never stops and never gets there).
    """

    data: bytes | None = None
    status: int | None = None
    fail_first: int = 0
    truncate_first: int = 0
    range_ok: bool = True
    delay: float = 0.0
    trickle: float = 0.0
    hits: int = 0


@dataclass
class FileServer:
    """A ThreadingHTTPServer on 127.0.0.1 serving `routes`; `log` records (path, Range header) per request."""

    routes: dict[str, Route] = field(default_factory=dict)
    log: list[tuple[str, str | None]] = field(default_factory=list)
    port: int = 0

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path.lstrip('/')}"

    def add(self, path: str, **kw) -> str:
        self.routes["/" + path.lstrip("/")] = Route(**kw)
        return self.url(path)

    def requests(self, path: str) -> list[str | None]:
        """Range headers of the requests for `path`, in order."""
        return [r for p, r in self.log if p == "/" + path.lstrip("/")]


def _handler(server: FileServer):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # keep pytest output clean
            pass

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            try:
                self._serve()
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up first (the timeout test): nothing to report

        def _serve(self) -> None:
            rng = self.headers.get("Range")
            server.log.append((self.path, rng))
            route = server.routes.get(self.path)
            if route is None:
                self.send_error(404, "Not Found")
                return
            route.hits += 1
            if route.delay:
                time.sleep(route.delay)
            if route.status is not None:
                self.send_error(route.status)
                return
            if route.hits <= route.fail_first:
                self.send_error(500, "flaky")
                return
            data = route.data
            start = 0
            if rng and route.range_ok and rng.startswith("bytes=") and rng.endswith("-"):
                start = int(rng[6:-1])
                if start >= len(data):
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(data)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            else:
                self.send_response(200)
            body = data[start:]
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Accept-Ranges", "bytes" if route.range_ok else "none")
            self.end_headers()
            if route.hits <= route.fail_first + route.truncate_first:
                self.wfile.write(body[: len(body) // 2])  # then hang up: a truncated transfer
                self.wfile.flush()
                self.close_connection = True
                return
            if route.trickle:
                for i in range(len(body)):
                    self.wfile.write(body[i:i + 1])
                    self.wfile.flush()
                    time.sleep(route.trickle)
                return
            self.wfile.write(body)

    return Handler


def start_server() -> tuple[FileServer, ThreadingHTTPServer]:
    fs = FileServer()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fs))
    httpd.daemon_threads = True
    fs.port = httpd.server_address[1]
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return fs, httpd


def closed_port() -> int:
    """A local port with nothing listening (connection refused), to play 'offline'."""
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port
