"""Video through the one pipeline: a frame source, an ordered encoder sink, and the tracker between them (the
reader, writer and tracker are `gpen_tune.video`'s; this module joins them to the pipeline, which imports video
and never the other way round).

    decode (VideoReader, upright) -> detect -> track + smooth (in frame order) -> align -> restore (faces of many
    frames in one batch) -> paste -> encode (VideoWriter, frames at their source pts, sound copied)

`enhance_video(src, dst)` runs one file; `enhance_frames(frames, fps)` restores frames from any iterator of
arrays and yields them back in order. Memory stays flat: frames are pulled from the decoder only as the
scheduler's in-flight slots allow, and the encoder takes them in order as they finish.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gpen_tune.face.detect import default_notify
from gpen_tune.pipeline.job import ImageJob
from gpen_tune.pipeline.keyframes import KeyFrames
from gpen_tune.pipeline.scheduler import RunSummary, SchedulerConfig
from gpen_tune.pipeline.sources import SourceItem
from gpen_tune.video.frames import ArrayFrameSource, FrameQueueSink
from gpen_tune.video.reader import Frame, VideoReader
from gpen_tune.video.track import FaceTracker
from gpen_tune.video.writer import VideoWriter


class FrameSource:
    """The frames of a reader (or any object yielding `Frame`s) as pipeline items, in order."""

    ordered = True

    def __init__(self, frames: Iterable[Frame], name: str, stem: str, expected: int | None = None):
        self.frames = frames
        self.name = name
        self.stem = stem
        self.expected = expected

    def __iter__(self) -> Iterator[SourceItem]:
        for i, frame in enumerate(self.frames):
            yield SourceItem(f"{self.name} (frame {i})", self.stem, lambda f=frame: f.image, meta=frame)


class EncoderSink:
    """Restored frames into a writer at their source pts; a frame that failed is written as it came in."""

    ordered = True

    def __init__(self, write: Callable[[np.ndarray, int], None]):
        self._write = write
        self.passed_through = 0

    def write(self, job: ImageJob) -> None:
        frame: Frame = job.meta
        if job.status in ("ok", "no_face") and job.result is not None:
            image = job.result.rgb
        else:
            image = frame.image
            self.passed_through += 1
        self._write(image, frame.pts)
        return None


class FrameTracker:
    """`FaceTracker` on the frames' own times (pts x time base: variable frame rates keep their timing), and the
    video's key frames when the full detector runs only every `detect_every` frames (`key_frames`, read by the
    detect step)."""

    def __init__(self, fps: float, smooth: bool = True, detect_every: int = 1):
        self.tracker = FaceTracker(fps=fps, smooth=smooth)
        self.key_frames = KeyFrames(detect_every) if detect_every > 1 else None

    def update(self, detections: list, meta: Frame | None) -> list:
        t = None if meta is None else float(meta.pts * meta.time_base)
        return self.tracker.update(detections, t)


@dataclass
class VideoResult:
    summary: RunSummary
    output: Path | None
    frames: int
    faces: int
    decode_problems: str | None = None                   # corrupt / filled frames, one line
    passed_through: int = 0                              # frames written unrestored (a step failed on them)
    notes: list[str] = field(default_factory=list)       # encoder notes (re-encoded audio, 8-bit VP9, ...)

    @property
    def ok(self) -> bool:
        return self.output is not None and not self.summary.interrupted


def enhance_video(src: str | Path, dst: str | Path, pipeline: Any, *, codec: str | None = None,
                  crf: float | None = None, smooth: bool = True, serial: bool = False,
                  config: SchedulerConfig = SchedulerConfig(), on_result: Callable[[ImageJob], None] | None = None,
                  on_faces: Callable[[int], None] | None = None,
                  notify: Callable[[str], None] = default_notify, replace: bool = True,
                  encoder_preset: str | None = None, detect_every: int = 1) -> VideoResult:
    """Restore every face of the video `src` into `dst` (written under a temporary name, renamed when complete;
    `replace=False`: never onto a file that exists by then; `encoder_preset`: x264/x265's speed preset;
    `detect_every`: the full detector on every Nth frame, the frames between follow its faces).

    `pipeline`: a `gpen_tune.pipeline.api.Pipeline` (or a `DevicePool`). Ctrl-C (KeyboardInterrupt) or a failure
    leaves no file at `dst` (the temporary file is removed); a `VideoReadError` / `VideoWriteError` names the file
    in one line."""
    reader = VideoReader(src, upright=True)
    info = reader.info
    writer = VideoWriter(dst, info, codec=codec, crf=crf, device_type=pipeline.device.type, upright=True,
                         notify=notify, replace=replace, encoder_preset=encoder_preset)
    sink = EncoderSink(writer.write)
    source = FrameSource(reader, str(src), Path(dst).stem, reader.expected_frames)
    try:
        summary = pipeline.run(source, sink, serial=serial, config=config, on_result=on_result,
                               on_faces=on_faces, tracker=FrameTracker(float(info.fps or 25), smooth, detect_every))
    except BaseException:
        writer.abort()
        raise
    if summary.interrupted:
        writer.abort()
        output = None
    else:
        output = writer.close()
    faces = sum(len(j.faces) for j in summary.results if j.status == "ok")
    return VideoResult(summary, output, len(summary.results), faces, reader.report.summary(str(src)),
                       sink.passed_through, list(writer.notes))


def enhance_frames(frames: Iterable[np.ndarray], pipeline: Any, fps: float = 30.0, *, smooth: bool = True,
                   config: SchedulerConfig = SchedulerConfig(), detect_every: int = 1) -> Iterator[np.ndarray]:
    """Restored frames, in order, for frames from any iterator of HWC RGB arrays (a webcam, another decoder).

    The pipeline runs on a thread of its own; frames come back as they are encoded-ready, at most a few queued."""
    source_frames = ArrayFrameSource(frames, fps=fps)
    queue_sink = FrameQueueSink(maxsize=8)
    sink = EncoderSink(lambda image, pts: queue_sink.write(image, pts))
    source = FrameSource(source_frames, "<frames>", "frames")
    failure: list[BaseException] = []

    def work() -> None:
        try:
            pipeline.run(source, sink, config=config, tracker=FrameTracker(fps, smooth, detect_every))
        except BaseException as e:  # handed to the consumer below
            failure.append(e)
            queue_sink.abort(str(e))
        else:
            queue_sink.close()

    thread = threading.Thread(target=work, name="gpen-frames", daemon=True)
    thread.start()
    for frame in queue_sink:
        yield frame.image
    thread.join()
    if failure:
        raise failure[0]
