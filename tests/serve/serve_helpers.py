"""Helpers of the service tests: a real uvicorn server on 127.0.0.1 (in a thread, or `gpen-tune serve` in a child
process), real photos written as files, a PNG header claiming a huge image. Not a conftest.py: the test modules
import from here."""

from __future__ import annotations

import io
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from gpen_tune.face import samples

pytest.importorskip("fastapi", reason="the serve extra is not installed (sh scripts/setup.sh --dev installs it)")

import uvicorn  # noqa: E402

from gpen_tune.serve import create_app  # noqa: E402

READY_TIMEOUT_S = 300.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen | None = None, timeout: float = READY_TIMEOUT_S) -> None:
    """Until /readyz answers 200 (the models loaded and warm); fails with the child's exit when it died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            output = proc.stdout.read() if proc.stdout else ""
            raise AssertionError(f"the server exited with {proc.returncode}: {output}")
        try:
            r = httpx.get(f"{url}/readyz", timeout=5)
            if r.status_code == 200:
                return
            if "could not be loaded" in r.text:
                raise AssertionError(r.text)
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} not ready within {timeout} s")


@contextmanager
def server_thread(*, spool: Path, **kw) -> Iterator[str]:
    """`create_app(**kw)` under uvicorn in a thread of this process; yields its base URL, stops it after."""
    port = free_port()
    app = create_app(spool=spool, notify=lambda msg: None, **kw)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url)
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=60)


@contextmanager
def serve_process(args: list[str], tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    """`gpen-tune serve ARGS` in a child process on a free port; yields (URL, process); killed if still running."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    proc = subprocess.Popen([sys.executable, "-m", "gpen_tune", "serve", "--port", str(port),
                             "--spool", str(tmp_path / "spool"), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def photo_files(folder: Path) -> list[Path]:
    """Real one-face photos as files: PNG and JPEG of the astronaut and of Grace Hopper."""
    folder.mkdir(parents=True, exist_ok=True)
    small_hopper = np.asarray(Image.fromarray(samples.grace_hopper()).resize((384, 450)))
    files = {"astronaut.png": samples.astronaut(), "hopper.jpg": samples.grace_hopper(),
             "hopper_small.png": small_hopper, "astronaut_q92.jpg": samples.astronaut()}
    paths = []
    for name, pixels in files.items():
        path = folder / name
        Image.fromarray(pixels).save(path, **({"quality": 92} if name.endswith(".jpg") else {}))
        paths.append(path)
    return paths


def decoded(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("RGB")).astype(np.int16)


def png_bomb(width: int = 100_000, height: int = 100_000) -> bytes:
    """A small PNG whose header claims width x height pixels (its data would decompress to tens of GB)."""
    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 1024)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def metric(url: str, name: str, headers: dict | None = None) -> float:
    """One unlabelled value of /metrics (Prometheus text)."""
    text = httpx.get(f"{url}/metrics", headers=headers or {}, timeout=10).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")
