"""One run of the pipeline for `enhance` and `demo`: build it, run every input with progress, print the summary,
write the report; Ctrl-C handled (once: finish the files being written; twice: stop at once, no partial file).

The report, the partial-file cleanup and the summary's numbers come from the library
(`gpen_tune.pipeline.report.run_report`, `gpen_tune.pipeline.outputs.remove_stale_temp_files`); this module only
prints and maps them to exit codes.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpen_tune.cli._console import err, failure, notice, out, user_errors
from gpen_tune.cli._progress import EnhanceProgress, print_summary


@dataclass
class RunOptions:
    """What `gpen_tune.enhance` takes besides inputs, folder, settings and tune (the command's choices)."""

    recursive: bool = False
    ext: str | None = None
    suffix: str = ""
    name_pattern: str = "{name}{suffix}.{ext}"
    existing: str = "refuse"
    save_faces: bool = False
    save_comparison: bool = False
    save_mask: bool = False
    serial: bool | None = None
    config: Any = None                       # SchedulerConfig (None: its defaults)
    video: Any = None                        # VideoOptions (None: its defaults)

    def as_kwargs(self) -> dict[str, Any]:
        from gpen_tune.pipeline.scheduler import SchedulerConfig  # heavy: torch (fast --help)

        return dict(recursive=self.recursive, ext=self.ext, suffix=self.suffix, name_pattern=self.name_pattern,
                    existing=self.existing, save_faces=self.save_faces, save_comparison=self.save_comparison,
                    save_mask=self.save_mask, serial=self.serial, config=self.config or SchedulerConfig(),
                    video=self.video)


def run_command(names: list[str], output: Path, settings: Any, tune: Any, options: RunOptions, *,
                report: Path | None = None, build: Callable[..., Any] | None = None,
                run: Callable[..., Any] | None = None) -> int:
    """Build the pipeline (`build`, default Pipeline), run every input (`run`, default gpen_tune.enhance) with
    progress, print the summary, write the report; returns the exit code."""
    from gpen_tune.pipeline.api import Pipeline, enhance  # heavy: torch (fast --help)
    from gpen_tune.pipeline.outputs import check_output_dir  # heavy: cv2 (fast --help)

    build, run = build or Pipeline, run or enhance
    created = not output.exists()
    t0 = time.perf_counter()
    try:
        check_output_dir(output)             # an unusable -o fails before the model and its notices
        with _InterruptedWhileBuilding(output, created):
            pipe = build(settings, tune, notify=notice)
            detector_name = pipe.prepare()   # a missing detector or parser file fails before any image
    except user_errors() as e:
        _remove_if_empty(output, created)
        raise failure(e) from None
    progress = EnhanceProgress(err)
    try:
        with _Interrupts(output), progress:
            result = run(names, output, settings, tune, pipeline=pipe, on_result=progress.image_done,
                         on_faces=progress.faces_done, on_start=progress.start, notify=notice, report=report,
                         **options.as_kwargs())
    except user_errors() as e:
        _remove_if_empty(output, created)
        raise failure(e) from None
    finally:
        pipe.close()
    return _finish(result, pipe, settings, tune, detector_name, time.perf_counter() - t0, report)


def _finish(result: Any, pipe: Any, settings: Any, tune: Any, detector: str | None, wall: float,
            report: Path | None) -> int:
    """The summary on the console, the report on disk; the exit code."""
    from gpen_tune.pipeline.report import run_report, write_report  # heavy: torch (fast --help)

    data = run_report(result, settings=settings, tune=tune, pipeline=pipe, detector=detector, wall_s=wall)
    summary = data["summary"]
    print_summary(out, summary, result)
    for lane in summary.get("devices", []):
        lost = f", lost: {lane['lost']} ({lane['retried_elsewhere']} inputs retried elsewhere)" if lane["lost"] else ""
        out.print(f"device {lane['device']}: {lane['images']} images, {lane['faces']} faces, "
                  f"{lane['faces_per_s'] or 0:.2f} faces/s{lost}", highlight=False, soft_wrap=True)
    if report is not None:
        try:
            write_report(report, data)
        except OSError as e:
            err.print(f"[bold red]error:[/] --report {report}: not written ({e.strerror or e})", highlight=False,
                      soft_wrap=True)
            return result.exit_code or 1
    if result.summary.interrupted:
        err.print("[bold red]interrupted:[/] images not processed are listed as not processed; every file "
                  "written is complete")
    return result.exit_code


def _remove_if_empty(folder: Path, created: bool) -> None:
    """A failed validation leaves no empty output folder behind (only one this command created)."""
    if created and folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()


class _SigintScope:
    """Installs `self._handler` for Ctrl-C inside a `with` block (the previous handler comes back after it)."""

    previous = None

    def _handler(self, signum, frame) -> None:
        raise NotImplementedError

    def __enter__(self):
        try:
            self.previous = signal.signal(signal.SIGINT, self._handler)
        except ValueError:                      # not the main thread (e.g. inside a test runner's thread)
            self.previous = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


class _InterruptedWhileBuilding(_SigintScope):
    """Ctrl-C while the pipeline is built (model, detector, kernels): exit 130 at once with one line. Nothing is
    written yet, and a KeyboardInterrupt raised there can land inside a Python callback of native code (torch's
    extensions), which aborts the process instead of unwinding it."""

    def __init__(self, output: Path, created: bool):
        self.output, self.created = output, created

    def _handler(self, signum, frame) -> None:
        _remove_if_empty(self.output, self.created)
        err.print("\n[bold red]interrupted[/] while starting: nothing was written")
        os._exit(130)


class _Interrupts(_SigintScope):
    """Ctrl-C once: stop taking new images, finish the files being written, summary, exit 130. Twice: exit 130 at
    once (temp files of this run removed first: no partial output, no abort from threads inside native code)."""

    def __init__(self, output: Path):
        self.output = output
        self.count = 0

    def _handler(self, signum, frame) -> None:
        from gpen_tune.pipeline.outputs import remove_stale_temp_files  # imported by the run already

        self.count += 1
        if self.count == 1:
            raise KeyboardInterrupt
        remove_stale_temp_files(self.output, pid=os.getpid())   # images' and videos' temp files of this run
        err.print("\n[bold red]interrupted twice:[/] stopped at once; every file written is complete")
        os._exit(130)
