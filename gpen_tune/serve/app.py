"""`create_app`: the ASGI app of `gpen-tune serve` (FastAPI), for uvicorn or for mounting in a user's own server.

    from gpen_tune.serve import create_app
    app = create_app(EnhanceSettings(weights="GPEN-BFR-512"), spool="/var/spool/gpen")   # uvicorn module:app

Routes: POST /v1/enhance, the jobs (/v1/jobs...), /healthz, /readyz, /metrics, and the web page at /. The OpenAPI
page is at /docs. docs/serve.md describes them, the limits and the auth.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from importlib import resources
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from gpen_tune import __version__
from gpen_tune.serve.limits import HttpRefusal, ServeLimits, check_ext, check_header, token_matches
from gpen_tune.serve.service import Restored, Service
from gpen_tune.serve.spool import SpoolFull
from gpen_tune.serve.steps import VIDEO_EXTS, RequestOptions, Steps

MEDIA_TYPES = {"jpg": "image/jpeg", "jpeg": "image/jpeg", "png": "image/png", "webp": "image/webp",
               "bmp": "image/bmp", "tif": "image/tiff", "tiff": "image/tiff", "mp4": "video/mp4",
               "mov": "video/quicktime", "mkv": "video/x-matroska", "webm": "video/webm"}
IMAGE_BODY = {"requestBody": {"required": True, "description": "The image: a raw body (image/jpeg, image/png, ...) "
                              "or multipart/form-data with a `file` part.",
                              "content": {"image/*": {"schema": {"type": "string", "format": "binary"}},
                                          "multipart/form-data": {"schema": {
                                              "type": "object", "properties": {"file": {"type": "string",
                                                                                         "format": "binary"}}}}}}}


def create_app(settings: Any = None, tune: Any = None, *, spool: str | Path = "gpen-serve-spool",
               limits: ServeLimits = ServeLimits(), token: str | None = None, model: Any = None,
               notify: Callable[[str], None] = print, steps: Callable[[], Steps] | None = None) -> FastAPI:
    """The service over one pipeline built from `settings` (EnhanceSettings) and `tune` (TuneConfig).

    Args:
        spool: the folder of jobs and of uploads in progress (created).
        limits: upload, pixel, queue, time and spool bounds.
        token: when given, every /v1 route and /metrics need `Authorization: Bearer <token>`.
        model: a loaded generator to use instead of loading `settings.weights`.
        steps: builds the pipeline steps instead (wins over settings, tune and model).
    The models load in the background once the app starts: /healthz answers at once, /readyz when they are warm.
    While it runs the app lowers the process's GIL hand-over interval (as the threaded scheduler does; restored
    at shutdown) and on the CPU sets torch's threads to one share of the cores each for detection and generator.
    Mounted under another app, enter its lifespan from the parent's (Starlette starts no mounted app's lifespan):
    `async with served.router.lifespan_context(served): yield`.
    """
    build = steps or (lambda: Steps.build(settings, tune, notify, model))
    service = Service(build, limits, Path(spool), notify)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        service.start()
        yield
        await run_in_threadpool(service.close)

    app = FastAPI(title="gpen-tune serve", version=__version__, lifespan=lifespan,
                  description="GPEN face restoration over HTTP; faces of concurrent requests share generator calls.")
    app.state.service = service

    @app.exception_handler(HttpRefusal)
    async def refused(request: Request, exc: HttpRefusal) -> JSONResponse:
        return JSONResponse({"error": exc.message, "status": exc.status}, exc.status, headers=exc.headers)

    @app.exception_handler(Exception)
    async def failed(request: Request, exc: Exception) -> JSONResponse:   # a bug or a device error: still JSON
        return JSONResponse({"error": " ".join(str(exc).split()) or type(exc).__name__, "status": 500}, 500)

    auth = _auth_dependency(token)
    _health_routes(app, service, auth)
    _enhance_route(app, service, limits, auth)
    _job_routes(app, service, limits, auth)
    app.mount("/", StaticFiles(directory=str(resources.files("gpen_tune.serve") / "static"), html=True), name="page")
    return app


def _auth_dependency(token: str | None) -> Callable[[Request], None]:
    def check(request: Request) -> None:
        if token is not None and not token_matches(request.headers.get("authorization"), token):
            raise HttpRefusal(401, "missing or wrong bearer token (Authorization: Bearer <token>)",
                              {"WWW-Authenticate": "Bearer"})

    return check


def _health_routes(app: FastAPI, service: Service, auth) -> None:
    @app.get("/healthz", tags=["health"], summary="The process is alive")
    async def healthz() -> dict[str, str]:
        return {"status": "alive"}

    @app.get("/readyz", tags=["health"], summary="The models are loaded and warm")
    async def readyz() -> dict[str, Any]:
        service.check_ready()
        return {"status": "ready", "device": str(service.steps.device), **service.counters()}

    @app.get("/metrics", tags=["health"], summary="Prometheus metrics")
    async def metrics(_: None = Depends(auth)) -> Response:
        return Response(service.metrics.render(), media_type="text/plain; version=0.0.4")


def _enhance_route(app: FastAPI, service: Service, limits: ServeLimits, auth) -> None:
    @app.post("/v1/enhance", tags=["restore"], openapi_extra=IMAGE_BODY, summary="Restore every face of one image",
              responses={200: {"content": {"image/*": {}}, "description": "The restored image (in the input's "
                                "format unless `ext`), X-Faces and Server-Timing headers; JSON with base64 when "
                                "`response=json`"}})
    async def enhance(request: Request, _: None = Depends(auth),
                      strength: float = Query(1.0, ge=0.0, le=1.0, description="0 = unchanged, 1 = restored"),
                      only_center_face: bool = Query(False, description="Restore only the face nearest the centre"),
                      parse_mask: bool | None = Query(None, description="Paste through ParseNet's mask (default: "
                                                      "the server's setting)"),
                      ext: str | None = Query(None, description="Output format: jpg, png, webp, bmp, tiff"),
                      response: str = Query("image", pattern="^(image|json)$", description="image or json "
                                            "(base64)")) -> Response:
        t0 = time.perf_counter()
        service.metrics.in_progress.inc()
        status = 500
        try:
            data, name = await read_upload(request, limits)
            in_ext = check_header(data, name, limits.max_pixels)
            options = RequestOptions(strength, only_center_face, parse_mask, check_ext(ext))
            result = await service.restore(data, name, in_ext, options, request.is_disconnected)
            service.metrics.on_restored(result.timings)
            status = 200
            return _image_response(result, response)
        except HttpRefusal as e:
            status = e.status
            raise
        finally:
            service.metrics.in_progress.dec()
            service.metrics.requests.labels("/v1/enhance", str(status)).inc()
            service.metrics.latency.labels("/v1/enhance").observe(time.perf_counter() - t0)


def _image_response(result: Restored, kind: str) -> Response:
    timing = ", ".join(f"{k};dur={v * 1000:.1f}" for k, v in result.timings.items())
    headers = {"X-Faces": str(result.faces), "Server-Timing": timing}
    if kind == "json":
        return JSONResponse({"faces": result.faces, "format": result.ext, "timings_s": result.timings,
                             "image_base64": base64.b64encode(result.data).decode()}, headers=headers)
    return Response(result.data, media_type=MEDIA_TYPES[result.ext.lower()], headers=headers)


def _job_routes(app: FastAPI, service: Service, limits: ServeLimits, auth) -> None:
    @app.post("/v1/jobs", status_code=202, tags=["jobs"], openapi_extra=IMAGE_BODY,
              summary="Queue an image or a video as a job (its files live in the spool until they expire)")
    async def create_job(request: Request, _: None = Depends(auth), strength: float = Query(1.0, ge=0.0, le=1.0),
                         only_center_face: bool = Query(False), parse_mask: bool | None = Query(None),
                         ext: str | None = Query(None)) -> JSONResponse:
        data, name = await read_upload(request, limits)
        kind, in_ext = await service.in_thread(service.job_kind, data, name)
        out_ext = check_ext(ext, VIDEO_EXTS) if kind == "video" else check_ext(ext)
        options = RequestOptions(strength, only_center_face, parse_mask, out_ext)
        try:
            record = service.submit_job(data, name, kind, in_ext, options)
        except SpoolFull as e:
            raise HttpRefusal(507, str(e)) from None
        return JSONResponse(record.public(), 202, headers={"Location": f"/v1/jobs/{record.id}"})

    def record_of(job_id: str):
        record = service.spool.get(job_id)
        if record is None:
            raise HttpRefusal(404, f"no job {job_id} (never created, deleted, or expired)")
        return record

    @app.get("/v1/jobs/{job_id}", tags=["jobs"], summary="A job's state and progress")
    async def get_job(job_id: str, _: None = Depends(auth)) -> dict[str, Any]:
        return record_of(job_id).public()

    @app.get("/v1/jobs/{job_id}/result", tags=["jobs"], summary="A finished job's image")
    async def job_result(job_id: str, _: None = Depends(auth)) -> Response:
        record = record_of(job_id)
        if record.state != "done":
            raise HttpRefusal(409, f"job {job_id} is {record.state}: no result" + (f" ({record.error})"
                                                                                   if record.error else ""))
        path = service.spool.folder(job_id) / record.result
        return FileResponse(path, media_type=MEDIA_TYPES[path.suffix.lstrip(".").lower()],
                            headers={"X-Faces": str(record.faces)})

    @app.delete("/v1/jobs/{job_id}", tags=["jobs"], summary="Cancel a job and remove its files")
    async def delete_job(job_id: str, _: None = Depends(auth)) -> dict[str, Any]:
        record = service.cancel_job(job_id)
        if record is None:
            raise HttpRefusal(404, f"no job {job_id}")
        return record.public()


async def read_upload(request: Request, limits: ServeLimits) -> tuple[bytes, str]:
    """The image bytes and a name for messages: a raw body or the `file` part of a multipart form; 413 past the
    byte limit (from Content-Length at once, else while reading)."""
    cap = limits.max_upload_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > cap:
        raise HttpRefusal(413, f"upload of {int(declared)} bytes is above this server's limit of {cap}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            raise HttpRefusal(413, f"upload is above this server's limit of {cap} bytes")
        chunks.append(chunk)
    body = b"".join(chunks)
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        if not body:
            raise HttpRefusal(400, "empty body: send the image as the body or as the `file` part of a form")
        return body, "upload"
    return await _form_file(request, body)


async def _form_file(request: Request, body: bytes) -> tuple[bytes, str]:
    async def replay() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    form = await Request(request.scope, replay).form()
    part = form.get("file")
    if not isinstance(part, UploadFile):
        raise HttpRefusal(400, "multipart form without a `file` part holding the image")
    return await part.read(), part.filename or "upload"

