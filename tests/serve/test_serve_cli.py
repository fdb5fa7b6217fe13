"""`gpen-tune serve` as users start it: the extra's absence, the weights and bind rules (one line, exit 1), and
SIGTERM on a real child process draining the request in flight before it exits."""

from __future__ import annotations

import signal
import sys
import threading

import httpx
import pytest
import typer
from conftest_weights import checkpoint_file
from serve_helpers import metric, photo_files, serve_process
from typer.testing import CliRunner

from gpen_tune.cli import app
from gpen_tune.pipeline.conflicts import serve_detector_process
from gpen_tune.serve import MISSING_EXTRA
from gpen_tune.serve.limits import default_request_processes, shared_memory_shortfall


def invoke(args: list[str]):
    command = typer.main.get_command(app)
    argv = (["serve"] if hasattr(command, "commands") else []) + args
    return CliRunner().invoke(app, argv, catch_exceptions=False)


def test_without_the_extra_one_line_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "fastapi", None)      # as if the serve extra were not installed
    res = invoke(["--weights", "synthetic"])
    assert res.exit_code == 1
    assert [ln for ln in res.output.splitlines() if ln.strip()] == [f"error: {MISSING_EXTRA}"]


def test_refuses_to_start_without_weights():
    res = invoke(["--device", "cpu"])
    assert res.exit_code == 1 and "needs --weights" in res.output and "synthetic" in res.output


@pytest.mark.parametrize("args, says", [
    (["--host", "0.0.0.0"], "--no-auth"),
    (["--host", "192.0.2.7", "--token", "t", "--no-auth"], "contradict"),
])
def test_beyond_loopback_needs_a_token_or_no_auth(args, says, monkeypatch):
    monkeypatch.delenv("GPEN_TUNE_TOKEN", raising=False)
    res = invoke(args + ["--weights", "synthetic", "--device", "cpu"])
    assert res.exit_code == 1 and says in res.output
    assert "SYNTHETIC" not in res.output                  # refused before any model was built


def test_generator_calls_below_one_is_one_line_naming_the_flag():
    res = invoke(["--weights", "synthetic", "--device", "cpu", "--detector", "mtcnn", "--generator-calls", "0"])
    assert res.exit_code == 1
    errors = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "--generator-calls 0" in errors[0] and "at least 1" in errors[0], res.output


def test_help_lists_the_options():
    res = invoke(["--help"])
    assert res.exit_code == 0
    for flag in ("--host", "--port", "--token", "--no-auth", "--weights", "--preset", "--spool", "--max-upload-mb",
                 "--max-megapixels", "--max-queue-faces", "--timeout", "--max-wait-ms", "--generator-calls",
                 "--detector-process", "--detector-thread", "--detector-processes", "--request-threads",
                 "--request-processes", "--access-log", "--no-access-log", "--mps"):
        assert flag in res.output


@pytest.mark.parametrize(("asked", "device", "lazy", "runs"), [
    (None, "cuda", False, True),       # a GPU server: the detector's own process by default
    (None, "cpu", False, False),       # the CPU: the generator is the limit, no process
    (None, "mps", False, False),
    (None, "cuda", True, False),       # --preset low-memory releases the detector: a process cannot be released
    (False, "cuda", False, False),     # --detector-thread
    (True, "cpu", False, True),        # --detector-process
])
def test_detector_process_default_is_on_for_a_gpu_server(asked, device, lazy, runs):
    assert serve_detector_process(asked, device, lazy) is runs
    assert serve_detector_process(asked if asked else None, device, lazy, processes=2) is True   # implied


def test_request_processes_default_to_none_off_a_gpu():
    """4 only on a GPU of 64 GiB or more (each process holds its own detector there); the CPU keeps its threads."""
    assert default_request_processes("cpu") == 0


def test_request_processes_need_room_in_shared_memory():
    """A 512 px face is 768 KiB; 256 queued faces twice over need 384 MiB of /dev/shm (a container's default is 64)."""
    short = shared_memory_shortfall(512, 256, free=64 * 2**20)
    assert short is not None and "64 MiB free" in short and "384 MiB" in short
    assert shared_memory_shortfall(512, 256, free=384 * 2**20) is None
    assert shared_memory_shortfall(256, 16, free=7 * 2**20) is None          # 6 MiB for 16 faces of 256 px


def test_request_processes_asked_for_without_room_in_shared_memory_is_one_line():
    """Asked for with a queue no /dev/shm here holds: a one-line error naming the fixes, before anything loads."""
    res = invoke(["--weights", "synthetic", "--device", "cpu", "--detector", "mtcnn", "--request-processes", "2",
                  "--max-queue-faces", "100000000"])
    errors = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert res.exit_code == 1 and len(errors) == 1, res.output
    assert "/dev/shm" in errors[0] and "--shm-size" in errors[0] and "--request-processes 0" in errors[0]


def test_with_request_processes_the_servers_own_detector_is_a_thread_unless_asked():
    """Each request process detects on its own thread; the server's detector serves only the jobs then."""
    assert serve_detector_process(None, "cuda", False, request_processes=4) is False
    assert serve_detector_process(True, "cuda", False, request_processes=4) is True


def test_detector_thread_with_detector_processes_is_one_line():
    res = invoke(["--weights", "synthetic", "--device", "cpu", "--detector", "mtcnn", "--detector-thread",
                  "--detector-processes", "2"])
    assert res.exit_code == 1
    errors = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "--detector-thread and --detector-processes" in errors[0], res.output
    res = invoke(["--weights", "synthetic", "--device", "cpu", "--detector", "mtcnn", "--detector-processes", "0"])
    assert res.exit_code == 1 and "--detector-processes 0" in res.output, res.output


def test_request_threads_below_one_is_one_line_naming_the_flag():
    res = invoke(["--weights", "synthetic", "--device", "cpu", "--detector", "mtcnn", "--request-threads", "0"])
    assert res.exit_code == 1
    errors = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "--request-threads 0" in errors[0] and "1 or more" in errors[0], res.output
    res = invoke(["--weights", "synthetic", "--device", "cpu", "--detector", "mtcnn", "--request-processes", "-1"])
    errors = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert res.exit_code == 1 and len(errors) == 1 and "--request-processes -1" in errors[0], res.output


@pytest.mark.slow
def test_sigterm_drains_the_request_in_flight_then_exits(tmp_path):
    """The face waits for a batch (up to 4 s) when SIGTERM arrives: the response still comes, then the process
    exits 0."""
    photo = photo_files(tmp_path / "photos")[2]
    args = ["--weights", str(checkpoint_file("GPEN-BFR-256")), "--model", "GPEN-BFR-256", "--device", "cpu",
            "--detector", "mtcnn", "--batch-size", "4", "--max-wait-ms", "4000"]
    with serve_process(args, tmp_path) as (url, proc):
        answer: dict = {}
        client = threading.Thread(target=lambda: answer.update(r=httpx.post(
            f"{url}/v1/enhance", content=photo.read_bytes(), headers={"Content-Type": "image/png"}, timeout=120)))
        client.start()
        while metric(url, "gpen_serve_queue_faces") < 1:     # the face is queued: the request is in flight
            assert client.is_alive()
        proc.send_signal(signal.SIGTERM)
        client.join()
        assert proc.wait(timeout=120) == 0
        out = proc.stdout.read()
    assert answer["r"].status_code == 200 and answer["r"].headers["x-faces"] == "1", out
    assert "Shutting down" in out or "shutdown" in out.lower()
