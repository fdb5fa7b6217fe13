"""What flows through the pipeline: one `ImageJob` per input (a photo or a video frame), its `FaceCrop`s."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gpen_tune.face.detect import Detection
from gpen_tune.imageio import Picture

STAGES = ("decode", "detect", "align", "restore", "paste", "encode")


@dataclass
class FaceCrop:
    crop: np.ndarray | None              # [S, S, 3] uint8 RGB on the host (None when cut on the device)
    affine: np.ndarray                   # 2x3 image -> crop
    inverse: np.ndarray                  # 2x3 crop -> image
    detection: Detection | None          # None for --aligned inputs
    restored: np.ndarray | None = None   # [S, S, 3] uint8 RGB after the restore step (host)
    parse_mask: np.ndarray | None = None  # [S, S] float32 paste mask of the parser, from its batch (host paste)
    parse_mask_device: Any = None        # the same on the device (device paste)


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
    image_device: Any = None             # [H, W, 3] uint8 on the device when the faces were cut there
    crops_device: Any = None             # [F, S, S, 3] uint8 on the device: the faces cut there
    nonfinite_faces: int = 0             # faces left as the input after a non-finite output (worker records)
    meta: Any = None                     # the source item's meta, for the sink (a video frame's timestamp)
    detections: list[Detection] | None = None   # kept for an ordered step (tracking) before alignment
    video: dict[str, Any] | None = None  # a whole video's outcome (frames, faces, notes) when this job is one
    blend_weights: np.ndarray | None = None   # [H, W] paste weights in [0, 1], kept for --save-mask

    @property
    def face_count(self) -> int:
        return int(self.video["faces"]) if self.video is not None else len(self.faces)

    def add_time(self, stage: str, seconds: float) -> None:
        self.timings[stage] = self.timings.get(stage, 0.0) + seconds

    def fail(self, message: str) -> None:
        """Mark the job failed with a one-line message (control characters of file names shown escaped, so a
        name with a line break cannot split it)."""
        self.status, self.error = "error", one_line_text(message)

    def release(self, meta: bool = False) -> None:
        """Free the pixels once written (`meta`: the source item's too, e.g. a decoded frame); the report keeps
        the rest."""
        if meta:
            self.meta = None
        self.picture = self.result = None
        self.image_device = self.crops_device = self.blend_weights = None
        for face in self.faces:
            face.crop = face.restored = face.parse_mask = face.parse_mask_device = None

    def report(self) -> dict:
        return {
            "input": self.source,
            "output": None if self.output is None else str(self.output),
            "status": self.status,
            "error": self.error,
            "size": None if self.size is None else list(self.size),
            "faces": [f.detection.to_dict() for f in self.faces if f.detection is not None],
            "n_faces": self.face_count,
            "video": self.video,
            "timings_s": {k: round(v, 4) for k, v in self.timings.items()},
        }
