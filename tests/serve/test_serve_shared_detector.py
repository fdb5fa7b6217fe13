"""`gpen-tune serve --request-processes 2 --shared-detector` as users start it: one detector process (a
`DetectorHost`) detects for both request processes, the responses carry `enhance`'s pixels, and the host's
death turns the server not ready; SIGTERM still exits 0 and every child goes."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from serve_helpers import decoded, serve_process
from test_serve_api import MODEL, TOLERANCE, enhanced, photos, post, weights  # noqa: F401 - fixtures

pytestmark = pytest.mark.slow   # a real server with three spawned children


def _spawned(pid: int) -> list[str]:
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [c for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]


def test_one_detector_process_serves_every_request_process(weights, photos, enhanced, tmp_path):  # noqa: F811
    args = ["--weights", str(weights), "--model", MODEL, "--device", "cpu", "--detector", "mtcnn",
            "--batch-size", "4", "--request-processes", "2", "--shared-detector", "--no-access-log"]
    with serve_process(args, tmp_path) as (url, proc):
        spawned = _spawned(proc.pid)
        assert len(spawned) == 3, spawned                   # two request processes and the detector's
        with ThreadPoolExecutor(len(photos)) as pool:
            responses = list(pool.map(lambda p: post(url, p, ext="png"), photos))
        host = min(spawned, key=lambda c: int(Path(f"/proc/{c}/stat").read_text().split()[21]))  # started first
        os.kill(int(host), signal.SIGKILL)                  # the shared detector dies: the server says so
        deadline = time.monotonic() + 30
        while httpx.get(f"{url}/readyz", timeout=10).status_code == 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        not_ready = httpx.get(f"{url}/readyz", timeout=10)
        proc.terminate()
        assert proc.wait(timeout=120) == 0
    for path, r in zip(photos, responses, strict=True):
        assert r.status_code == 200, r.text
        assert r.headers["x-faces"] == "1"
        assert np.abs(decoded(r.content) - decoded(enhanced[path.name])).max() <= TOLERANCE, path.name
    assert not_ready.status_code == 503 and "shared detector" in not_ready.json()["error"], not_ready.text
    deadline = time.monotonic() + 60
    while any(Path(f"/proc/{c}").exists() for c in spawned) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(Path(f"/proc/{c}").exists() for c in spawned)


def test_shared_detector_without_request_processes_is_one_line():
    from test_serve_cli import invoke

    res = invoke(["--weights", "synthetic", "--device", "cpu", "--detector", "mtcnn", "--request-processes", "0",
                  "--shared-detector"])
    errors = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert res.exit_code == 1 and len(errors) == 1 and "--shared-detector" in errors[0], res.output
