"""`gpen_tune.serve` over real HTTP on 127.0.0.1 with real photos and the real offline detector: concurrent
requests share generator calls and give `gpen-tune enhance`'s pixels; jobs; the limits; auth; a restart's spool.

Stated tolerance: 2 grey levels per pixel against `enhance` (faces batched with other requests' faces change the
float summation order, as the threaded scheduler's batches do: tests/pipeline/test_threads.py)."""

from __future__ import annotations

import base64
import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
import typer
from conftest_weights import checkpoint_file
from model_configs import SMALLEST
from serve_helpers import decoded, metric, photo_files, png_bomb, serve_process, server_thread
from typer.testing import CliRunner

from gpen_tune.cli import app as cli_app
from gpen_tune.load import load_model
from gpen_tune.pipeline.settings import EnhanceSettings
from gpen_tune.serve import ServeLimits
from gpen_tune.serve.spool import JobSpool, SpoolFull

MODEL = "GPEN-BFR-256"
TOLERANCE = 2
TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> list[Path]:
    return photo_files(tmp_path_factory.mktemp("photos"))


@pytest.fixture(scope="module")
def weights() -> Path:
    return checkpoint_file(MODEL)


@pytest.fixture(scope="module")
def enhanced(photos, weights, tmp_path_factory) -> dict[str, bytes]:
    """`gpen-tune enhance` on the same files (PNG outputs: pixels compared without a second JPEG encoding)."""
    out = tmp_path_factory.mktemp("enhanced")
    command = typer.main.get_command(cli_app)
    argv = ["enhance"] if hasattr(command, "commands") else []
    res = CliRunner().invoke(cli_app, argv + [str(p) for p in photos] + [
        "-o", str(out), "--weights", str(weights), "--model", MODEL, "--detector", "mtcnn", "--device", "cpu",
        "--ext", "png", "--suffix", "_x", "--preset", "none"], catch_exceptions=False)   # the server's fp32 generator
    assert res.exit_code == 0, res.output
    return {p.name: (out / f"{p.stem}_x.png").read_bytes() for p in photos}


@pytest.fixture(scope="module")
def batching_server(weights, tmp_path_factory):
    """GPEN-BFR-256 from a checkpoint in the official layout; a face waits up to 10 s for 3 others (batch 4)."""
    settings = EnhanceSettings(model=MODEL, weights=str(weights), detector="mtcnn", device="cpu", batch_size=4)
    with server_thread(settings=settings, spool=tmp_path_factory.mktemp("spool"),
                       limits=ServeLimits(max_wait_ms=10_000)) as url:
        yield url


@pytest.fixture(scope="module")
def parallel_server(weights, tmp_path_factory):
    """Batch 1 with two generator calls at once (the CPU default on 2 cores; asked for here on any core count)."""
    settings = EnhanceSettings(model=MODEL, weights=str(weights), detector="mtcnn", device="cpu", batch_size=1)
    with server_thread(settings=settings, spool=tmp_path_factory.mktemp("parallel"),
                       limits=ServeLimits(generator_calls=2)) as url:
        yield url


@pytest.fixture(scope="module")
def small_model():
    return load_model("synthetic", model=SMALLEST, device="cpu")


@pytest.fixture(scope="module")
def strict_server(small_model, tmp_path_factory):
    """A token, one queued face at most, 1 MB uploads, 1 megapixel, 8 s per request; a face waits for a batch
    (of 4) for up to 60 s, so it stays queued while the test looks."""
    limits = ServeLimits(max_upload_bytes=2**20, max_pixels=1_000_000, max_queue_faces=1, request_timeout_s=8,
                         max_wait_ms=60_000)
    settings = EnhanceSettings(weights="synthetic", detector="mtcnn", device="cpu", batch_size=4)
    with server_thread(settings=settings, model=small_model, spool=tmp_path_factory.mktemp("strict"),
                       limits=limits, token=TOKEN) as url:
        yield url


AUTH = {"Authorization": f"Bearer {TOKEN}"}


def post(url: str, path: Path, **params) -> httpx.Response:
    kind = "image/png" if path.suffix == ".png" else "image/jpeg"
    return httpx.post(f"{url}/v1/enhance", params=params, content=path.read_bytes(),
                      headers={"Content-Type": kind}, timeout=300)


def test_concurrent_requests_share_generator_calls_and_give_enhance_pixels(batching_server, photos, enhanced):
    url = batching_server
    calls, faces = metric(url, "gpen_serve_generator_calls_total"), metric(url, "gpen_serve_faces_total")
    busy = metric(url, "gpen_serve_generator_seconds_total")
    start = time.perf_counter()
    with ThreadPoolExecutor(len(photos)) as pool:
        responses = list(pool.map(lambda p: post(url, p, ext="png"), photos))
    wall = time.perf_counter() - start
    calls = metric(url, "gpen_serve_generator_calls_total") - calls
    faces = metric(url, "gpen_serve_faces_total") - faces
    busy = metric(url, "gpen_serve_generator_seconds_total") - busy
    assert faces == len(photos) == 4
    assert calls < faces                                   # faces of different requests shared a call
    assert 0 < busy < wall                                 # the generator's time, inside the requests' time
    for path, r in zip(photos, responses, strict=True):
        assert r.status_code == 200, r.text
        assert r.headers["x-faces"] == "1" and r.headers["content-type"] == "image/png"
        assert "detect;dur=" in r.headers["server-timing"] and "restore;dur=" in r.headers["server-timing"]
        ours, theirs = decoded(r.content), decoded(enhanced[path.name])
        assert ours.shape == theirs.shape
        assert np.abs(ours - theirs).max() <= TOLERANCE, path.name
        assert np.abs(ours - decoded(path.read_bytes())).max() > 10   # the face was restored, not passed through


def test_two_generator_calls_at_once_give_enhance_pixels(parallel_server, photos, enhanced):
    """Two batcher workers, each restoring one face per call in its own thread, while 8 requests come at once."""
    url = parallel_server
    assert metric(url, "gpen_serve_generator_workers") == 2
    calls, faces = metric(url, "gpen_serve_generator_calls_total"), metric(url, "gpen_serve_faces_total")
    with ThreadPoolExecutor(2 * len(photos)) as pool:
        responses = list(pool.map(lambda p: post(url, p, ext="png"), photos + photos))
    assert metric(url, "gpen_serve_faces_total") - faces == 2 * len(photos)
    assert metric(url, "gpen_serve_generator_calls_total") - calls == 2 * len(photos)     # batch 1
    for path, r in zip(photos + photos, responses, strict=True):
        assert r.status_code == 200, r.text
        ours, theirs = decoded(r.content), decoded(enhanced[path.name])
        assert ours.shape == theirs.shape
        assert np.abs(ours - theirs).max() <= TOLERANCE, path.name


@pytest.mark.slow
def test_request_processes_give_enhance_pixels_and_share_generator_calls(weights, photos, enhanced, tmp_path):
    """`gpen-tune serve --request-processes 2`: two processes decode, detect, paste and encode (started before the
    server is ready); the faces of their requests share this server's generator calls and the pixels are
    `enhance`'s; a bad upload is a 400 naming the client's file; the processes go with the server."""
    args = ["--weights", str(weights), "--model", MODEL, "--device", "cpu", "--detector", "mtcnn",
            "--batch-size", "4", "--max-wait-ms", "10000", "--request-processes", "2"]
    with serve_process(args, tmp_path) as (url, proc):
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        spawned = [c for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]
        assert len(spawned) == 2, children                    # the request processes, there before any request
        assert httpx.get(f"{url}/readyz", timeout=10).json()["request_processes"] == 2
        calls, faces = metric(url, "gpen_serve_generator_calls_total"), metric(url, "gpen_serve_faces_total")
        with ThreadPoolExecutor(len(photos)) as pool:
            responses = list(pool.map(lambda p: post(url, p, ext="png"), photos))
        assert metric(url, "gpen_serve_faces_total") - faces == len(photos)
        assert metric(url, "gpen_serve_generator_calls_total") - calls < len(photos)   # shared across processes
        unchanged = post(url, photos[0], ext="png", strength=0.0)
        jpeg = next(p for p in photos if p.suffix == ".jpg").read_bytes()
        broken = httpx.post(f"{url}/v1/enhance", files={"file": ("holiday.jpg", jpeg[: len(jpeg) // 3],
                                                                 "image/jpeg")}, timeout=60)   # pixels that do not read
        no_parser = httpx.post(f"{url}/v1/enhance", params={"parse_mask": "true"}, content=jpeg, timeout=60)
        mapped_segments = [line for pid in [proc.pid, *spawned]
                           for line in Path(f"/proc/{pid}/maps").read_text().splitlines() if "/psm_" in line]
        job = httpx.post(f"{url}/v1/jobs", files={"file": (photos[1].name, photos[1].read_bytes(), "image/jpeg")},
                         timeout=60).json()                    # jobs run in the server's own process
        deadline = time.monotonic() + 120
        while job["state"] in ("queued", "running") and time.monotonic() < deadline:
            time.sleep(0.3)
            job = httpx.get(f"{url}/v1/jobs/{job['id']}", timeout=10).json()
        os.kill(int(spawned[0]), signal.SIGKILL)              # a request process dies: the server says so
        deadline = time.monotonic() + 30
        while httpx.get(f"{url}/readyz", timeout=10).status_code == 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        not_ready = httpx.get(f"{url}/readyz", timeout=10)
        after_death = post(url, photos[0], ext="png")
        proc.terminate()
        assert proc.wait(timeout=120) == 0
        output = proc.stdout.read()
    assert '"POST /v1/enhance?ext=png HTTP/1.1" 200' in output     # the access log, on by default
    assert job["state"] == "done" and job["faces"] == 1, job
    assert not_ready.status_code == 503 and "request process" in not_ready.json()["error"], not_ready.text
    assert after_death.status_code == 503 and "restart the server" in after_death.json()["error"]
    for path, r in zip(photos, responses, strict=True):
        assert r.status_code == 200, r.text
        assert r.headers["x-faces"] == "1"
        assert "detect;dur=" in r.headers["server-timing"] and "restore;dur=" in r.headers["server-timing"]
        ours, theirs = decoded(r.content), decoded(enhanced[path.name])
        assert ours.shape == theirs.shape
        assert np.abs(ours - theirs).max() <= TOLERANCE, path.name
        assert np.abs(ours - decoded(path.read_bytes())).max() > 10   # the face was restored, not passed through
    assert unchanged.status_code == 200
    assert np.abs(decoded(unchanged.content) - decoded(photos[0].read_bytes())).max() <= 1
    assert broken.status_code == 400 and "holiday.jpg" in broken.json()["error"], broken.text
    assert "spool" not in broken.json()["error"]              # named as the client named it, not by its path here
    assert no_parser.status_code == 400 and "ParseNet" in no_parser.json()["error"], no_parser.text
    deadline = time.monotonic() + 60
    while any(Path(f"/proc/{c}").exists() for c in spawned) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(Path(f"/proc/{c}").exists() for c in spawned)
    assert not mapped_segments, mapped_segments                # every request's segment unmapped on both sides


@pytest.mark.slow
def test_request_processes_let_go_of_what_timed_out_or_gone_requests_held(tmp_path, photos):
    """A face that waits past the timeout (504) and one whose client hangs up are dropped from the batcher, and
    the request process frees what it held for them: its shared-memory segments are unmapped and removed."""
    args = ["--weights", "synthetic", "--model", MODEL, "--device", "cpu", "--detector", "mtcnn",
            "--batch-size", "4", "--max-wait-ms", "60000", "--timeout", "4", "--request-processes", "1",
            "--no-access-log"]
    small = next(p for p in photos if p.name == "hopper_small.png")
    with serve_process(args, tmp_path) as (url, proc):
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        child = next(c for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes())
        dropped = metric(url, "gpen_serve_faces_dropped_total")
        late = post(url, small)
        assert late.status_code == 504, late.text
        with pytest.raises(httpx.ReadTimeout):                # the client gives up while its face is queued
            httpx.post(f"{url}/v1/enhance", content=small.read_bytes(), headers={"Content-Type": "image/png"},
                       timeout=httpx.Timeout(60, read=1.5))
        _until(lambda: metric(url, "gpen_serve_faces_dropped_total") == dropped + 2)
        _until(lambda: "/psm_" not in Path(f"/proc/{child}/maps").read_text())
        _until(lambda: not [p for p in (tmp_path / "spool" / "requests").rglob("*") if p.is_file()])  # its files
        proc.terminate()
        assert proc.wait(timeout=120) == 0
        assert "POST /v1/enhance" not in proc.stdout.read()    # --no-access-log


@pytest.mark.slow
def test_detector_in_its_own_process_gives_enhance_pixels(weights, photos, enhanced, tmp_path):
    """`gpen-tune serve --detector-processes 2`: the detector runs in two child processes (started before the server
    is ready), concurrent requests get `enhance`'s pixels, and the children go with the server."""
    args = ["--weights", str(weights), "--model", MODEL, "--device", "cpu", "--detector", "mtcnn",
            "--batch-size", "4", "--max-wait-ms", "2000", "--detector-processes", "2"]
    with serve_process(args, tmp_path) as (url, proc):
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        spawned = [c for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]
        assert len(spawned) == 2, children                    # the detector's processes, there before any request
        with ThreadPoolExecutor(len(photos)) as pool:
            responses = list(pool.map(lambda p: post(url, p, ext="png"), photos))
        proc.terminate()
        assert proc.wait(timeout=120) == 0
    for path, r in zip(photos, responses, strict=True):
        assert r.status_code == 200, r.text
        ours, theirs = decoded(r.content), decoded(enhanced[path.name])
        assert np.abs(ours - theirs).max() <= TOLERANCE, path.name
    deadline = time.monotonic() + 60                         # the child sees its pipe close, then exits
    while any(Path(f"/proc/{c}").exists() for c in spawned) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(Path(f"/proc/{c}").exists() for c in spawned)


def test_job_runs_through_the_spool_and_answers_in_the_input_format(batching_server, photos, enhanced):
    url = batching_server
    jpeg = next(p for p in photos if p.suffix == ".jpg")
    r = httpx.post(f"{url}/v1/jobs", files={"file": (jpeg.name, jpeg.read_bytes(), "image/jpeg")}, timeout=60)
    assert r.status_code == 202, r.text
    job = r.json()
    assert job["state"] == "queued" and r.headers["location"] == f"/v1/jobs/{job['id']}"
    state = job
    deadline = time.monotonic() + 300
    while state["state"] in ("queued", "running") and time.monotonic() < deadline:
        time.sleep(0.3)
        state = httpx.get(f"{url}/v1/jobs/{job['id']}").json()
    assert state["state"] == "done" and state["progress"] == 1.0 and state["faces"] == 1, state
    result = httpx.get(f"{url}/v1/jobs/{job['id']}/result")
    assert result.status_code == 200 and result.headers["content-type"] == "image/jpeg"
    assert decoded(result.content).shape == decoded(enhanced[jpeg.name]).shape
    gone = httpx.delete(f"{url}/v1/jobs/{job['id']}")
    assert gone.status_code == 200
    assert httpx.get(f"{url}/v1/jobs/{job['id']}").status_code == 404
    assert httpx.get(f"{url}/v1/jobs/{job['id']}/result").status_code == 404


def test_health_ready_metrics_and_openapi(batching_server, photos):
    url = batching_server
    assert httpx.get(f"{url}/healthz").json() == {"status": "alive"}
    ready = httpx.get(f"{url}/readyz").json()
    assert ready["status"] == "ready" and ready["device"] == "cpu"
    assert post(url, photos[0]).status_code == 200          # labelled series appear with their first request
    text = httpx.get(f"{url}/metrics").text
    for name in ("gpen_serve_requests_total", "gpen_serve_request_seconds_bucket", "gpen_serve_faces_total",
                 "gpen_serve_faces_per_generator_call_bucket", "gpen_serve_generator_seconds_total",
                 "gpen_serve_queue_faces",
                 "gpen_serve_gpu_memory_bytes"):
        assert name in text
    paths = httpx.get(f"{url}/openapi.json").json()["paths"]
    assert {"/v1/enhance", "/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/result", "/healthz", "/readyz",
            "/metrics"} <= set(paths)
    params = {p["name"] for p in paths["/v1/enhance"]["post"]["parameters"]}
    assert {"strength", "only_center_face", "parse_mask", "ext", "response"} <= params


def test_each_restored_image_adds_its_step_times_to_the_stage_histograms(batching_server, photos):
    """gpen_serve_stage_seconds{stage=...}: the Server-Timing header's steps, summed over requests (a stage's series
    appears with the first request that has it)."""
    url = batching_server
    def stage(suffix: str, name: str) -> float:
        return metric(url, f'gpen_serve_stage_seconds_{suffix}{{stage="{name}"}}')

    def step_ms(r: httpx.Response) -> dict[str, float]:
        return {k: float(v) for k, v in (part.split(";dur=") for part in r.headers["server-timing"].split(", "))}

    steps = step_ms(post(url, photos[0]))
    assert {"decode", "detect", "align", "restore", "paste", "encode"} <= steps.keys()
    before = {name: (stage("count", name), stage("sum", name)) for name in steps}
    for name, ms in step_ms(post(url, photos[1])).items():
        count, total = before[name]
        assert stage("count", name) == count + 1
        assert abs((stage("sum", name) - total) * 1000 - ms) <= 0.05 + 1e-6    # the header rounds to 0.1 ms


def test_token_is_required_and_checked(strict_server, photos):
    url = strict_server
    assert httpx.get(f"{url}/healthz").status_code == 200             # probes need no token
    assert httpx.get(f"{url}/metrics").status_code == 401
    r = post(url, photos[0])
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer" and "token" in r.json()["error"]
    r = httpx.get(f"{url}/metrics", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401
    assert httpx.get(f"{url}/metrics", headers=AUTH).status_code == 200


def test_refusals_are_clear_json_errors(strict_server, photos):
    url = strict_server

    def send(data: bytes, kind: str = "image/png") -> httpx.Response:
        return httpx.post(f"{url}/v1/enhance", content=data, headers={**AUTH, "Content-Type": kind}, timeout=60)

    r = send(png_bomb())                                   # 10^10 pixels claimed: refused from the header
    assert r.status_code == 413 and "pixels" in r.json()["error"], r.text
    r = send(png_bomb(1200, 1000))                         # just over this server's 1 megapixel
    assert r.status_code == 413 and "1.2 megapixels" in r.json()["error"]
    r = send(b"\0" * (2**20 + 1), "application/octet-stream")
    assert r.status_code == 413 and "limit" in r.json()["error"]
    r = send(b"just some text", "text/plain")
    assert r.status_code == 415
    gif = httpx.post(f"{url}/v1/enhance", content=_gif(), headers={**AUTH, "Content-Type": "image/gif"})
    assert gif.status_code == 415 and "GIF" in gif.json()["error"]
    jpeg = next(p for p in photos if p.suffix == ".jpg").read_bytes()
    r = send(jpeg[: len(jpeg) // 3], "image/jpeg")         # a header that reads, pixels that do not
    assert r.status_code == 400, r.text
    r = httpx.post(f"{url}/v1/enhance", params={"ext": "gif"}, content=jpeg, headers=AUTH)
    assert r.status_code == 400 and "ext=gif" in r.json()["error"]
    r = httpx.post(f"{url}/v1/enhance", params={"strength": 2}, content=jpeg, headers=AUTH)
    assert r.status_code == 422
    r = httpx.post(f"{url}/v1/enhance", params={"parse_mask": "true"}, content=jpeg, headers=AUTH)
    assert r.status_code == 400 and "ParseNet" in r.json()["error"]


def test_queue_full_timeout_and_client_gone(strict_server, photos):
    """One face waits in the queue (its batch of 4 never fills): a second request finds the queue full (503), the
    first ends at the request timeout (504) and its face is dropped; a client that hangs up has its face dropped."""
    url = strict_server
    small = next(p for p in photos if p.name == "hopper_small.png")
    first: dict = {}
    waiting = threading.Thread(target=lambda: first.update(r=_post_auth(url, small)))
    dropped = metric(url, "gpen_serve_faces_dropped_total", AUTH)
    waiting.start()
    _until(lambda: metric(url, "gpen_serve_queue_faces", AUTH) == 1)
    busy = _post_auth(url, small)
    assert busy.status_code == 503 and busy.headers["retry-after"] == "1" and "busy" in busy.json()["error"]
    waiting.join()
    assert first["r"].status_code == 504 and "timeout" in first["r"].json()["error"]
    _until(lambda: metric(url, "gpen_serve_queue_faces", AUTH) == 0)
    assert metric(url, "gpen_serve_faces_dropped_total", AUTH) == dropped + 1
    with pytest.raises(httpx.ReadTimeout):                # the client gives up while its face is queued
        _post_auth(url, small, timeout=httpx.Timeout(60, read=1.5))
    _until(lambda: metric(url, "gpen_serve_faces_dropped_total", AUTH) == dropped + 2)
    assert metric(url, "gpen_serve_queue_faces", AUTH) == 0


def test_restart_queues_again_the_jobs_it_finds_in_the_spool(small_model, photos, tmp_path):
    """A server killed with a job running and one queued: the next server on that spool runs both, saying so."""
    spool = tmp_path / "spool"
    earlier = JobSpool(spool / "jobs", 2**30, 3600)
    png = photos[0]
    running = earlier.create(png.read_bytes(), png.name, "png", {"strength": 1.0, "only_center_face": False,
                                                                  "parse_mask": None, "ext": None})
    running.state = "running"
    earlier.save(running)
    queued = earlier.create(png.read_bytes(), png.name, "png", {"strength": 0.5, "only_center_face": False,
                                                                 "parse_mask": None, "ext": "jpg"})
    settings = EnhanceSettings(weights="synthetic", detector="mtcnn", device="cpu")
    with server_thread(settings=settings, model=small_model, spool=spool) as url:
        for job, kind in ((running, "image/png"), (queued, "image/jpeg")):
            _until(lambda j=job: httpx.get(f"{url}/v1/jobs/{j.id}").json()["state"] == "done")
            state = httpx.get(f"{url}/v1/jobs/{job.id}").json()
            assert "restart" in state["note"] and state["faces"] == 1
            assert httpx.get(f"{url}/v1/jobs/{job.id}/result").headers["content-type"] == kind


def _post_auth(url: str, path: Path, timeout=60) -> httpx.Response:
    return httpx.post(f"{url}/v1/enhance", content=path.read_bytes(), headers={**AUTH, "Content-Type": "image/png"},
                      timeout=timeout)


def _until(check, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.1)


def _gif() -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("P", (8, 8)).save(buf, format="GIF")
    return buf.getvalue()


def test_video_job_shares_the_generator_with_live_requests(small_model, photos, tmp_path):
    """A video job runs the pipeline's video path on the server's generator; an image request meanwhile is served."""
    import av
    from video.clips import make_clip

    clip = make_clip(tmp_path / "clip.mp4", n=12, size=(192, 144), subtitles=False)
    settings = EnhanceSettings(weights="synthetic", detector="mtcnn", device="cpu")
    with server_thread(settings=settings, model=small_model, spool=tmp_path / "spool") as url:
        r = httpx.post(f"{url}/v1/jobs", files={"file": ("clip.mp4", clip.read_bytes(), "video/mp4")}, timeout=60)
        assert r.status_code == 202, r.text
        job = r.json()
        assert job["kind"] == "video"
        live = post(url, photos[2], response="json")               # the image as base64 in JSON
        assert live.status_code == 200 and live.json()["faces"] == 1 and live.json()["format"] == "png"
        assert decoded(base64.b64decode(live.json()["image_base64"])).shape == decoded(photos[2].read_bytes()).shape
        _until(lambda: httpx.get(f"{url}/v1/jobs/{job['id']}").json()["state"] not in ("queued", "running"), 300)
        state = httpx.get(f"{url}/v1/jobs/{job['id']}").json()
        assert state["state"] == "done" and state["progress"] == 1.0 and state["faces"] >= 10, state
        result = httpx.get(f"{url}/v1/jobs/{job['id']}/result")
        assert result.status_code == 200 and result.headers["content-type"] == "video/mp4"
        (tmp_path / "out.mp4").write_bytes(result.content)
        with av.open(str(tmp_path / "out.mp4")) as container:
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        assert len(frames) == 12 and frames[0].shape == (144, 192, 3)
        bad = httpx.post(f"{url}/v1/jobs", params={"ext": "png"}, content=clip.read_bytes())
        assert bad.status_code == 400 and "ext=png" in bad.json()["error"]
        junk = httpx.post(f"{url}/v1/jobs", content=b"neither an image nor a video")
        assert junk.status_code == 415
        gif = httpx.post(f"{url}/v1/jobs", content=_gif())               # FFmpeg reads it, but it is a refused image
        assert gif.status_code == 415 and "GIF" in gif.json()["error"]


def test_spool_quota_and_expiry(tmp_path):
    """The spool refuses a job that would pass its quota, and removes finished jobs once they expire (queued ones
    stay whatever their age)."""
    spool = JobSpool(tmp_path / "jobs", quota_bytes=2000, expiry_s=60)   # each job: 700 bytes + its job.json
    options = {"strength": 1.0, "only_center_face": False, "parse_mask": None, "ext": None}
    done = spool.create(b"x" * 700, "a.png", "png", options)
    waiting = spool.create(b"y" * 700, "b.png", "png", options)
    with pytest.raises(SpoolFull, match="full"):
        spool.create(b"z" * 700, "c.png", "png", options)
    done.state = "done"
    spool.save(done)
    assert spool.expire() == 0                              # not old yet
    for record in (done, waiting):                          # both an hour old
        record.updated = time.time() - 3600
        path = spool.folder(record.id) / "job.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "updated": record.updated}))
    assert spool.expire() == 1
    assert spool.get(done.id) is None and not spool.folder(done.id).exists()
    assert spool.get(waiting.id).state == "queued"
    assert spool.create(b"z" * 700, "c.png", "png", options).state == "queued"   # room again


def test_deleting_a_running_video_job_stops_it_and_removes_its_files(small_model, tmp_path):
    from video.clips import make_clip

    clip = make_clip(tmp_path / "long.mp4", n=150, size=(192, 144), subtitles=False, audio=False)
    settings = EnhanceSettings(weights="synthetic", detector="mtcnn", device="cpu")
    spool = tmp_path / "spool"
    with server_thread(settings=settings, model=small_model, spool=spool) as url:
        job = httpx.post(f"{url}/v1/jobs", files={"file": ("long.mp4", clip.read_bytes(), "video/mp4")}).json()
        _until(lambda: httpx.get(f"{url}/v1/jobs/{job['id']}").json()["progress"] > 0)
        gone = httpx.delete(f"{url}/v1/jobs/{job['id']}")
        assert gone.status_code == 200 and gone.json()["state"] == "cancelled"
        _until(lambda: httpx.get(f"{url}/v1/jobs/{job['id']}").status_code == 404)
        _until(lambda: not (spool / "jobs" / job["id"]).exists())
        assert httpx.get(f"{url}/readyz").status_code == 200


def test_the_app_mounts_in_a_users_own_server(small_model, photos, tmp_path):
    """create_app's app under a path of another FastAPI app, its lifespan entered from the parent's."""
    import threading as th
    from contextlib import asynccontextmanager

    import uvicorn
    from fastapi import FastAPI
    from serve_helpers import free_port, wait_ready

    from gpen_tune.serve import create_app

    served = create_app(EnhanceSettings(weights="synthetic", detector="mtcnn", device="cpu"), model=small_model,
                        spool=tmp_path / "spool", notify=lambda msg: None)

    @asynccontextmanager
    async def lifespan(app):
        async with served.router.lifespan_context(served):
            yield

    parent = FastAPI(lifespan=lifespan)
    parent.get("/own")(lambda: {"own": True})
    parent.mount("/gpen", served)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(parent, host="127.0.0.1", port=port, log_level="warning"))
    thread = th.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_ready(f"http://127.0.0.1:{port}/gpen")
        assert httpx.get(f"http://127.0.0.1:{port}/own").json() == {"own": True}
        r = post(f"http://127.0.0.1:{port}/gpen", photos[2])
        assert r.status_code == 200 and r.headers["x-faces"] == "1"
    finally:
        server.should_exit = True
        thread.join(timeout=60)


@pytest.mark.gpu
def test_concurrent_requests_on_cuda_are_pasted_on_the_device_with_enhance_pixels(weights, photos, tmp_path,
                                                                                   no_tf32):
    """On CUDA the faces are pasted on the GPU (the restored rows stay there): concurrent requests sharing
    generator calls give `enhance --device cuda`'s pixels (full fp32 convs: with TF32 other batch sizes pick other
    algorithms, as in tests/pipeline/test_threads.py's CUDA test)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    out = tmp_path / "enhanced"
    res = CliRunner().invoke(cli_app, ["enhance", *[str(p) for p in photos], "-o", str(out), "--weights",
                                       str(weights), "--model", MODEL, "--detector", "mtcnn", "--device", "cuda",
                                       "--ext", "png", "--suffix", "_x", "--preset", "none"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    settings = EnhanceSettings(model=MODEL, weights=str(weights), detector="mtcnn", device="cuda", batch_size=4)
    with server_thread(settings=settings, spool=tmp_path / "spool", limits=ServeLimits(max_wait_ms=2_000)) as url:
        with ThreadPoolExecutor(2 * len(photos)) as pool:
            responses = list(pool.map(lambda p: post(url, p, ext="png"), photos + photos))
    for path, r in zip(photos + photos, responses, strict=True):
        assert r.status_code == 200, r.text
        ours, theirs = decoded(r.content), decoded((out / f"{path.stem}_x.png").read_bytes())
        assert ours.shape == theirs.shape
        assert np.abs(ours - theirs).max() <= TOLERANCE, path.name


@pytest.mark.gpu
def test_service_warms_every_bucket_and_pads_a_lone_face_to_one_row_on_cuda(weights):
    """With CUDA graphs (`--preset speed`) the service warms each bucket up to the limit before it is ready and
    pads a batch to the smallest of them: one face runs as a batch of one, not of the limit."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from gpen_tune.serve.steps import Steps
    from gpen_tune.tune.options import PRESETS

    settings = EnhanceSettings(model=MODEL, weights=str(weights), detector="mtcnn", device="cuda", batch_size=8)
    steps = Steps.build(settings, PRESETS["speed"], notify=lambda msg: None)
    try:
        inner = steps.pipeline.restorer
        assert inner.one_shape
        steps.warm_up()
        assert inner.pad_to_buckets
        padded = inner.times.padded
        face = np.full((inner.size, inner.size, 3), 90, np.uint8)
        steps.restorer.submit([face]).result()
        steps.restorer.submit([face] * 3).result()
        assert inner.times.padded - padded == 1                 # 1 as 1, 3 as 4: not 7 + 5 rows of padding
    finally:
        steps.close()
