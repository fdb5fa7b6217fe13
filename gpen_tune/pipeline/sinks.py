"""Sinks: where finished jobs go (the encode step). A sink has `write(job) -> Path | None` and `ordered`.

`FileSink` encodes each photo atomically (temp file + rename; an untouched picture in its own format is copied
byte for byte), plus the optional side-by-side faces and comparisons. `MemorySink` keeps the result arrays
(`gpen_tune.enhance_image`, frames handed back to a caller). A new sink (a video encoder, an object store) is a
class with the same two members; `ordered = True` makes the steps' `finish` call `write` in source order, one job
at a time, every job (a failed one too).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Protocol

import numpy as np

from gpen_tune.face.check_images import comparison_image, weights_image
from gpen_tune.imageio import Picture, copy_file, picture_from_array, to_array, write_image
from gpen_tune.pipeline.job import ImageJob
from gpen_tune.pipeline.outputs import OutputNaming
from gpen_tune.png_encode import PNG_LEVEL


class Sink(Protocol):
    ordered: bool

    def write(self, job: ImageJob) -> Path | None: ...


class FileSink:
    """Photos into a folder, named by `OutputNaming`; `save_faces` / `save_comparison` add side-by-sides."""

    ordered = False

    def __init__(self, naming: OutputNaming, save_faces: bool = False, save_comparison: bool = False,
                 save_mask: bool = False, png_level: int = PNG_LEVEL):
        self.naming = naming
        self.png_level = png_level
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
        replace = self.naming.replace
        if job.result is pic and pic.path is not None and fmt == pic.format:
            job.output = copy_file(pic.path, path, replace=replace)
        else:
            job.output = write_image(job.result, path, fmt, self.png_level, replace=replace)
        if self.save_faces:
            self._faces(job, fmt)
        if self.save_comparison:
            self._side(Picture(comparison_image(job.picture, job.result)), "comparisons", job.stem, fmt)
        if self.save_mask and job.blend_weights is not None:
            self._side(picture_from_array(weights_image(job.blend_weights)), "masks", job.stem, "PNG")
        job.add_time("encode", time.perf_counter() - t)
        return job.output

    def _side(self, pic: Picture, folder: str, stem: str, fmt: str) -> None:
        """A side image: planned like the photo (`plan_outputs`), never replacing a file without --overwrite."""
        path = self.naming.side_path(folder, stem, fmt)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_image(pic, path, fmt, replace=self.naming.replace)

    def _faces(self, job: ImageJob, fmt: str) -> None:
        for i, face in enumerate(job.faces):
            if face.restored is not None and face.crop is not None:
                self._side(Picture(np.hstack([face.crop, face.restored])), "faces", f"{job.stem}_face{i:02d}", fmt)


class MemorySink:
    """Result arrays (gray, RGB or RGBA, as each input) by source index."""

    ordered = False

    def __init__(self) -> None:
        self.results: dict[int, np.ndarray] = {}

    def write(self, job: ImageJob) -> None:
        if job.status in ("ok", "no_face"):
            self.results[job.index] = to_array(job.result)
        return None
