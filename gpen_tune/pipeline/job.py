"""What flows through the pipeline: one `ImageJob` per input (a photo or a video frame), its `FaceCrop`s."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from gpen_tune.face.detect import Detection
from gpen_tune.imageio import ImageReadError, Picture

STAGES = ("decode", "detect", "align", "restore", "paste", "encode")


@dataclass
class FaceCrop:
    crop: Any                            # [S, S, 3] uint8 RGB: a host array, or a device tensor when cut there
    affine: np.ndarray                   # 2x3 image -> crop
    inverse: np.ndarray                  # 2x3 crop -> image
    detection: Detection | None          # None for --aligned inputs
    restored: np.ndarray | None = None   # [S, S, 3] uint8 RGB after the restore step (host; None when not needed)
    restored_device: Any = None          # the same on the device (images pasted there)
    parse_mask: Any = None               # [S, S] float32 paste mask of the parser, where the image is pasted


_CONTROL = {c: f"\\x{c:02x}" for c in range(32)} | {10: "\\n", 13: "\\r", 9: "\\t", 127: "\\x7f"}


def one_line_text(text: str) -> str:
    """`text` with its control characters escaped (\\n, \\x1b, ...): one line whatever the file names in it."""
    return text.translate(_CONTROL)


@dataclass
class ImageJob:
    """One input through decode -> detect -> align -> restore -> paste -> encode; errors stay on the job."""

    source: str                          # the input's name for messages and reports (a path, or "<array>")
    index: int = 0                       # position in its source (results come back in this order)
    stem: str = ""                       # output name stem (sub-folders kept: "sub/name")
    picture: Picture | None = None
    faces: list[FaceCrop] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    status: str = "pending"              # pending | ok | no_face | error | skipped
    error: str | None = None
    result: Picture | None = None
    output: Path | None = None
    size: tuple[int, int] | None = None  # (width, height) once decoded
    load: Callable[[], Any] | None = None   # the source item's loader (decoded by `prepare`, then let go)
    on_device: bool = False              # the placement, decided once by `prepare`: faces pasted on the device
    waiting: int = 0                     # faces still to restore (set by `prepare`, counted down by `restore`)
    image_device: Any = None             # [H, W, 3] uint8 on the device when the faces were cut there
    nonfinite_faces: int = 0             # faces left as the input after a non-finite output (worker records)
    meta: Any = None                     # the source item's meta, for the sink (a video frame's timestamp)
    video: dict[str, Any] | None = None  # a whole video's outcome (frames, faces, notes) when this job is one
    blend_weights: np.ndarray | None = None   # [H, W] paste weights in [0, 1], kept for --save-mask

    @property
    def face_count(self) -> int:
        return int(self.video["faces"]) if self.video is not None else len(self.faces)

    def add_time(self, stage: str, seconds: float) -> None:
        self.timings[stage] = self.timings.get(stage, 0.0) + seconds

    def unrestored(self) -> list[tuple[ImageJob, int]]:
        """The faces (job, k) this job waits for from the restore step: none when it failed or has none to restore."""
        return [(self, k) for k in range(len(self.faces))] if self.waiting and self.status != "error" else []

    def fail(self, message: str) -> None:
        """Mark the job failed with a one-line message (control characters of file names shown escaped, so a
        name with a line break cannot split it)."""
        self.status, self.error = "error", one_line_text(message)

    def release(self, meta: bool = False) -> None:
        """Free the pixels once written (`meta`: the source item's too, e.g. a decoded frame); the report keeps
        the rest."""
        if meta:
            self.meta = None
        self.picture = self.result = self.load = None
        self.image_device = self.blend_weights = None
        for face in self.faces:
            face.crop = face.restored = face.restored_device = face.parse_mask = None

    def output_bytes(self) -> int | None:
        """The written file's size (what a compression choice such as --png-level trades against speed)."""
        try:
            return None if self.output is None else self.output.stat().st_size
        except OSError:
            return None

    def report(self) -> dict:
        return {
            "input": self.source,
            "output": None if self.output is None else str(self.output),
            "output_bytes": self.output_bytes(),
            "status": self.status,
            "error": self.error,
            "size": None if self.size is None else list(self.size),
            "faces": [f.detection.to_dict() for f in self.faces if f.detection is not None],
            "n_faces": self.face_count,
            "video": self.video,
            "timings_s": {k: round(v, 4) for k, v in self.timings.items()},
        }


# What fails one image and not the run, on every executor: a bad file, a failed step, memory running out (the
# threaded scheduler also fails its whole prepare group on anything else)
IMAGE_ERRORS = (ImageReadError, ValueError, OSError, RuntimeError, MemoryError, cv2.error)


def one_line(source: str, exc: BaseException) -> str:
    """One line naming the input: the exception's own message when it already does (ImageReadError)."""
    shown = one_line_text(source)                  # a file name with a line break stays on the line
    text = str(exc).strip().replace(source, shown)
    msg = text.splitlines()[0] if text else ""
    if shown in msg:
        return msg
    return f"{shown}: {type(exc).__name__}" + (f": {msg}" if msg else "")
