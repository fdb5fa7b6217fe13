"""`gpen-tune serve`: the HTTP service (a thin layer over `gpen_tune.serve.create_app` and uvicorn)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

from gpen_tune.cli import app
from gpen_tune.cli._console import fail, failure, notice, out, user_errors
from gpen_tune.cli._options import PresetOpt, tune_config_from_options
from gpen_tune.cli._options import panel_option as _opt  # short: it is on every option line

NET_PANEL = "Network and auth"
MODEL_PANEL = "Model and device"
LIMIT_PANEL = "Limits"

EXAMPLES = """
Examples:\n
  gpen-tune serve --weights GPEN-BFR-512\n
  gpen-tune serve --weights /models/GPEN-BFR-512.pth --host 0.0.0.0 --token "$TOKEN" --spool /spool
"""


@app.command(epilog=EXAMPLES)
def serve(
    host: Annotated[str, _opt("--host", panel=NET_PANEL, help="Address to listen on (beyond loopback a token or "
                              "--no-auth is needed).")] = "127.0.0.1",
    port: Annotated[int, _opt("--port", panel=NET_PANEL, help="TCP port.")] = 8000,
    access_log: Annotated[bool, _opt("--access-log/--no-access-log", panel=NET_PANEL,
                                     help="Print a line per request.")] = True,
    token: Annotated[str | None, _opt("--token", panel=NET_PANEL, envvar="GPEN_TUNE_TOKEN", show_default=False,
                                      help="Bearer token clients must send (env GPEN_TUNE_TOKEN).")] = None,
    no_auth: Annotated[bool, _opt("--no-auth", panel=NET_PANEL, help="Allow anyone on a non-loopback address.")]
    = False,
    model: Annotated[str, _opt("--model", panel=MODEL_PANEL, show_default=False,
                               help="GPEN-BFR-256, -512 (default), -1024 or -2048.")] = "GPEN-BFR-512",
    weights: Annotated[str | None, _opt("--weights", panel=MODEL_PANEL, metavar="PATH|NAME", show_default=False,
                                        help="A .pth file, a cached registry name, or 'synthetic' (required).")]
    = None,
    device: Annotated[str, _opt("--device", panel=MODEL_PANEL, help="auto, cuda, cuda:N, cpu or mps.")] = "auto",
    detector: Annotated[str, _opt("--detector", panel=MODEL_PANEL, help="retinaface_resnet50, "
                                  "retinaface_mobile0.25, mtcnn or auto.")] = "auto",
    parse_mask: Annotated[bool | None, _opt("--parse-mask/--no-parse-mask", panel=MODEL_PANEL, show_default=False,
                                            help="Paste through ParseNet's mask (default: when available).")]
    = None,
    parse_weights: Annotated[str | None, _opt("--parse-weights", panel=MODEL_PANEL, metavar="PATH",
                                              help="ParseNet weights file.")] = None,
    batch_size: Annotated[int | None, _opt("--batch-size", panel=MODEL_PANEL, metavar="N", show_default=False,
                                           help="Most faces per generator call (default: as enhance).")] = None,
    generator_calls: Annotated[int | None, _opt("--generator-calls", panel=MODEL_PANEL, metavar="N",
                                                show_default=False,
                                                help="Generator calls at once (default: 2 on a 2-core CPU, one per "
                                                "share of the cores; 1 on a GPU).")] = None,
    detector_process: Annotated[bool | None, _opt("--detector-process/--detector-thread", panel=MODEL_PANEL,
                                                   show_default=False,
                                                   help="Run the face detector in a process of its own (its own "
                                                   "GIL: more faces/s under many concurrent requests; about 10 s "
                                                   "more at start), or on a thread of the server. Default: a "
                                                   "process on a GPU, a thread on the CPU.")] = None,
    detector_processes: Annotated[int | None, _opt("--detector-processes", panel=MODEL_PANEL, metavar="N",
                                                    show_default=False,
                                                    help="Detector processes side by side, fed from one queue "
                                                    "(implies --detector-process; default 1).")] = None,
    preset: PresetOpt = None,
    spool: Annotated[Path, _opt("--spool", panel=LIMIT_PANEL, help="Folder of jobs and uploads in progress.")]
    = Path("gpen-serve-spool"),
    max_upload_mb: Annotated[float, _opt("--max-upload-mb", panel=LIMIT_PANEL, help="Largest upload.")] = 50.0,
    max_megapixels: Annotated[float, _opt("--max-megapixels", panel=LIMIT_PANEL, help="Largest image.")] = 40.0,
    max_queue_faces: Annotated[int, _opt("--max-queue-faces", panel=LIMIT_PANEL,
                                         help="Faces waiting beyond which requests get 503.")] = 256,
    timeout: Annotated[float, _opt("--timeout", panel=LIMIT_PANEL, help="Seconds per request before 504.")]
    = 120.0,
    max_wait_ms: Annotated[float, _opt("--max-wait-ms", panel=LIMIT_PANEL,
                                       help="How long a face waits for others to share its generator call.")] = 5.0,
    request_threads: Annotated[int, _opt("--request-threads", panel=LIMIT_PANEL, metavar="N",
                                         help="Threads that decode, detect, paste and encode requests (a request "
                                         "holds one while it waits for detection).")] = 40,
    request_processes: Annotated[int | None, _opt("--request-processes", panel=LIMIT_PANEL, metavar="N",
                                                  show_default=False,
                                                  help="Processes that decode, detect, paste and encode requests, "
                                                  "each with its own detector, feeding this process's generator "
                                                  "(0: this process's threads). Default: 4 on a GPU of 64 GiB or "
                                                  "more, else 0.")] = None,
    shared_detector: Annotated[bool, _opt("--shared-detector", panel=LIMIT_PANEL,
                                          help="One detector process detects for all request processes, their "
                                          "images batched together, instead of a detector in each.")] = False,
    mps: Annotated[bool, _opt("--mps", panel=LIMIT_PANEL,
                              help="Start a private NVIDIA MPS daemon for the server's processes, so that the "
                              "request processes' and the generator's kernels share the GPU at once instead of "
                              "taking turns (needs nvidia-cuda-mps-control).")] = False,
    spool_quota_mb: Annotated[float, _opt("--spool-quota-mb", panel=LIMIT_PANEL, help="Spool size limit.")]
    = 2048.0,
    job_expiry_h: Annotated[float, _opt("--job-expiry-h", panel=LIMIT_PANEL,
                                        help="Hours a finished job's files are kept.")] = 24.0,
) -> None:
    """Serve face restoration over HTTP: an API, a web page at /, jobs, health and metrics."""
    # Long for its Typer signature (one annotated parameter per flag); the body only validates and hands over.
    from gpen_tune.serve import MISSING_EXTRA, serve_extra_missing

    if serve_extra_missing():
        raise fail(MISSING_EXTRA)
    if not weights:
        raise fail("gpen-tune serve needs --weights: a .pth file, a cached registry name such as GPEN-BFR-512, or "
                   "'synthetic' for a test server (its output is no restoration)")
    from gpen_tune.serve.runner import UnsafeBind, check_bind, run_server

    try:
        check_bind(host, token, no_auth)
    except UnsafeBind as e:
        raise failure(e) from None
    with _mps(mps, device):                                  # before anything here touches CUDA
        from gpen_tune.model.configs import model_info
        from gpen_tune.pipeline.conflicts import check_detector_process, serve_detector_process
        from gpen_tune.pipeline.settings import (  # heavy: torch (fast --help)
            EnhanceSettings,
            detection_size,
            resolve_device,
        )
        from gpen_tune.serve.app import create_app  # heavy: torch (fast --help)
        from gpen_tune.serve.limits import (  # heavy: torch (fast --help)
            ServeLimits,
            default_request_processes,
            shared_memory_shortfall,
        )
        from gpen_tune.serve.mps import mps_hint
        from gpen_tune.serve.steps import Steps  # heavy: torch (fast --help)

        try:
            dev = resolve_device(device, notice)
            if mps and dev.type != "cuda":
                raise ValueError(f"--mps needs a CUDA GPU; the server would run on {dev}")
            tune, origin = tune_config_from_options(preset, device=dev.type)
            asked_processes = request_processes
            if request_processes is None:
                request_processes = default_request_processes(dev)
            short = request_processes and shared_memory_shortfall(model_info(model).config.size, max_queue_faces)
            if short and asked_processes is None:
                notice(f"{short}: serving without request processes (a container: --shm-size 2g)")
                request_processes = 0
            elif short:
                raise ValueError(f"{short}: give it more (a container: --shm-size 2g), lower --max-queue-faces, or "
                                 "pass --request-processes 0")
            if request_processes and dev.type == "cuda" and not mps and (hint := mps_hint(request_processes)):
                notice(hint)
            if request_processes and (detector_process or detector_processes):
                notice(f"each of the {request_processes} request processes detects its requests' faces: the "
                       "server's own detector (--detector-process / --detector-processes) serves only the jobs")
            detector_process = serve_detector_process(detector_process, dev.type, tune.lazy_detector,
                                                      detector_processes, request_processes)
            settings = EnhanceSettings(model=model, weights=weights, device=str(dev), detector=detector,
                                       det_size=detection_size(None, tune.face_crop),
                                       parse_mask=parse_mask, parse_weights=parse_weights, batch_size=batch_size,
                                       detector_process=detector_process,
                                       detector_processes=1 if detector_processes is None else detector_processes)
            check_detector_process(detector_process, tune.lazy_detector)
            limits = ServeLimits(max_upload_bytes=int(max_upload_mb * 2**20), max_pixels=int(max_megapixels * 1e6),
                                 max_queue_faces=max_queue_faces, request_timeout_s=timeout, max_wait_ms=max_wait_ms,
                                 generator_calls=generator_calls, request_threads=request_threads,
                                 request_processes=request_processes, shared_detector=shared_detector,
                                 spool_quota_bytes=int(spool_quota_mb * 2**20),
                                 job_expiry_s=job_expiry_h * 3600)
            steps = Steps.build(settings, tune, notice)          # a missing file fails here, before listening
            steps.generator_calls(generator_calls)               # --generator-calls checked before listening
            application = create_app(spool=spool, limits=limits, token=token, notify=notice, steps=lambda: steps)
        except user_errors() as e:
            raise failure(e) from None
        out.print(f"optimizations: {origin}", highlight=False, soft_wrap=True)
        run_server(application, host, port, access_log=access_log)


@contextlib.contextmanager
def _mps(asked: bool, device: str) -> Iterator[None]:
    """The private MPS daemon `--mps` asks for, around the server (none: not asked, or one already serves us)."""
    if not asked:
        yield
        return
    from gpen_tune.serve.mps import MpsError, PrivateMps, running_daemon

    if not device.startswith(("auto", "cuda")):
        raise fail(f"--mps puts the server's CUDA processes under MPS: it needs --device auto or cuda, not {device}")
    running = running_daemon()
    if running is not None:
        notice(f"an MPS daemon ({running}) already serves this process: --mps starts none")
        yield
        return
    try:
        daemon = PrivateMps.start()
    except MpsError as e:
        raise failure(e) from None
    try:
        yield
    finally:
        daemon.stop()
