"""Sinks: where finished jobs go (the encode step). A sink has `write(job) -> Path | None` and `ordered`.

`FileSink` encodes each photo atomically (temp file + rename; an untouched picture in its own format is copied
byte for byte), plus the optional side-by-side faces and comparisons. `MemorySink` keeps the result arrays
(`gpen_tune.enhance_image`, frames handed back to a caller). A new sink (a video encoder, an object store) is a
class with the same two members; `ordered = True` makes the scheduler call `write` in source order, from one
thread.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Protocol

import numpy as np

from gpen_tune.face.check_images import comparison_image, weights_image
from gpen_tune.imageio import FORMAT_TO_EXT, Picture, copy_file, to_array, write_image
from gpen_tune.pipeline.job import ImageJob
from gpen_tune.pipeline.outputs import OutputNaming


class Sink(Protocol):
    ordered: bool

    def write(self, job: ImageJob) -> Path | None: ...


class FileSink:
    """Photos into a folder, named by `OutputNaming`; `save_faces` / `save_comparison` add side-by-sides."""

    ordered = False

    def __init__(self, naming: OutputNaming, save_faces: bool = False, save_comparison: bool = False,
                 save_mask: bool = False):
        self.naming = naming
        self.save_faces = save_faces
        self.save_comparison = save_comparison
        self.save_mask = save_mask

    def write(self, job: ImageJob) -> Path | None:
        if job.status not in ("ok", "no_face"):
            return None
        t = time.perf_counter()
        pic = job.picture
        path, fmt = self.naming.path_for(pic, job.stem)
        path.parent.mkdir(parents=True, exist_ok=True)
        if job.result is pic and pic.path is not None and fmt == pic.format:
            job.output = copy_file(pic.path, path)
        else:
            job.output = write_image(job.result, path, fmt)
        if self.save_faces:
            self._faces(job, fmt)
        if self.save_comparison:
            self._comparison(job, fmt)
        if self.save_mask and job.blend_weights is not None:
            write_image(Picture(weights_image(job.blend_weights)), self._side_path("masks", job.stem, "PNG"), "PNG")
        job.add_time("encode", time.perf_counter() - t)
        return job.output

    def _side_path(self, folder: str, stem: str, fmt: str) -> Path:
        path = self.naming.outdir / folder / f"{stem}.{FORMAT_TO_EXT[fmt]}"
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def _faces(self, job: ImageJob, fmt: str) -> None:
        for i, face in enumerate(job.faces):
            if face.restored is not None and face.crop is not None:
                write_image(Picture(np.hstack([face.crop, face.restored])),
                            self._side_path("faces", f"{job.stem}_face{i:02d}", fmt), fmt)

    def _comparison(self, job: ImageJob, fmt: str) -> None:
        write_image(Picture(comparison_image(job.picture, job.result)), self._side_path("comparisons", job.stem, fmt),
                    fmt)


class MemorySink:
    """Result arrays (gray, RGB or RGBA, as each input) by source index."""

    ordered = False

    def __init__(self) -> None:
        self.results: dict[int, np.ndarray] = {}

    def write(self, job: ImageJob) -> None:
        if job.status in ("ok", "no_face"):
            self.results[job.index] = to_array(job.result)
        return None
