"""Progress and summary output of `enhance`: images and faces as they finish, then the tables."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from gpen_tune.pipeline.outputs import is_video


class EnhanceProgress:
    """A bar over images and video frames whose text advances per restored face (a 29-face photo moves face by
    face); the ETA comes from the images and the videos' frame counts. It fits 80 columns: the bar shrinks, and the
    current file's name shows only where the console has room for it."""

    NAME_MIN_WIDTH = 110        # columns from which the current file's name is shown too

    def __init__(self, console: Console):
        columns = [TextColumn("[bold]enhance[/]"), BarColumn(bar_width=16), MofNCompleteColumn(),
                   TextColumn("{task.fields[ips]:.2f}/s · {task.fields[faces]} faces · {task.fields[fps]:.2f}/s"),
                   TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn()]
        if console.width >= self.NAME_MIN_WIDTH:
            columns.append(TextColumn("{task.fields[current]}"))
        self.progress = Progress(*columns, console=console, transient=False)
        self.task = None
        self.images = self.faces = 0
        self.t0 = time.perf_counter()

    def start(self, total: int) -> None:
        self.t0 = time.perf_counter()
        self.task = self.progress.add_task("enhance", total=total, ips=0.0, fps=0.0, faces=0, current="")

    def _update(self, **kw: Any) -> None:
        if self.task is None:
            return
        dt = max(time.perf_counter() - self.t0, 1e-9)
        self.progress.update(self.task, ips=self.images / dt, fps=self.faces / dt, faces=self.faces, **kw)

    def faces_done(self, n: int) -> None:
        self.faces += n
        self._update()

    def image_done(self, job: Any) -> None:
        self.images += 1
        if job.status == "error":
            self.progress.console.print(f"[bold red]failed:[/] {escape(str(job.error))}", highlight=False,
                                        soft_wrap=True)
        self._update(advance=1, current=Path(job.source).name)

    def __enter__(self) -> EnhanceProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)


def print_summary(out: Console, summary: dict, result: Any) -> None:
    """The run's counts, the switches that ran, and the per-stage timings."""
    for line in result.missing:
        out.print(f"[bold red]failed:[/] {escape(line)}", highlight=False, soft_wrap=True)
    for job in result.refused:
        out.print(f"[bold red]failed:[/] {escape(str(job.error))}", highlight=False, soft_wrap=True)
    for job in result.summary.results:            # a whole video that failed (frames report through progress)
        if job.status == "error" and is_video(Path(job.source)):
            out.print(f"[bold red]failed:[/] {escape(str(job.error))}", highlight=False, soft_wrap=True)
        elif job.video is not None:
            problems = [job.video.get("decode_problems")] + [f"{job.source}: {n}" for n in job.video.get("notes", [])]
            for line in filter(None, problems):
                out.print(f"[yellow]video:[/] {escape(line)}", highlight=False, soft_wrap=True)
    for line in result.passed_over:
        out.print(f"[yellow]passed over:[/] {escape(line)}", highlight=False, soft_wrap=True)
    table = Table(title="gpen-tune enhance", show_header=True, header_style="bold")
    table.add_column("")
    table.add_column("value", justify="right")
    table.add_row("images with faces restored", str(summary["restored"]))
    if summary.get("videos"):
        table.add_row("videos written · frames", f"{summary['videos_written']} · {summary['frames']}")
    table.add_row("inputs without a face (written unchanged)", str(summary["no_face"]))
    if summary["skipped"]:
        table.add_row("existing outputs kept (--skip-existing)", str(summary["skipped"]))
    if summary["passed_over"]:
        table.add_row("files passed over in folders", str(len(summary["passed_over"])))
    table.add_row("failed inputs", f"[red]{summary['failed']}[/]" if summary["failed"] else "0")
    if summary["not_processed"]:
        table.add_row("not processed (interrupted)", str(summary["not_processed"]))
    table.add_row("faces restored", str(summary["faces"]))
    if summary["nonfinite_faces"]:
        table.add_row("[yellow]faces left as the input (non-finite output)[/]", str(summary["nonfinite_faces"]))
    table.add_row("wall time", f"{summary['wall_s']:.2f} s")
    rates = [(summary["images_per_s"], "images/s"), (summary.get("frames_per_s"), "frames/s"),
             (summary["faces_per_s"], "faces/s")]
    shown = [(v, unit) for v, unit in rates if v is not None]      # nothing written: no rate
    if shown:
        table.add_row(" · ".join(unit for _, unit in shown), " · ".join(f"{v:.2f}" for v, _ in shown))
    tune = summary.get("tune")
    if tune:
        ran = tune.get("effective_describe") or tune["describe"]
        table.add_row("optimizations", ran if ran == tune["describe"] else f"{ran} (asked: {tune['describe']})")
        for msg in tune.get("fallbacks", []):
            table.add_row("[yellow]fallback[/]", msg)
    out.print(table)
    print_stage_table(out, summary["stages"])


def print_stage_table(out: Console, stages: dict[str, dict]) -> None:
    """Per stage: total s, ms per image, ms per face (stages overlap when the threaded scheduler runs)."""
    table = Table(title="per-stage timings", show_header=True, header_style="bold",
                  caption="stage time summed over images (the pipelined threads overlap stages; wall time above)")
    for col in ("stage", "total s", "ms / image", "ms / face"):
        table.add_column(col, justify="left" if col == "stage" else "right")

    def fmt(v):
        return "-" if v is None else f"{v:.1f}"

    for name, row in stages.items():
        table.add_row(name, f"{row['total_s']:.3f}", fmt(row["ms_per_image"]), fmt(row["ms_per_face"]))
    out.print(table)
