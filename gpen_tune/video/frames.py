"""Frames in from any iterator of arrays (a webcam, another decoder) and restored frames back out to the caller.

`ArrayFrameSource` gives such an iterator what a `VideoReader` has (`fps`, `time_base`, `expected_frames` and
`Frame(image, pts, time_base)` items), so the pipeline consumes both alike. `FrameQueueSink` takes restored
frames like a `VideoWriter` (`write(image, pts)`, `close()`, `abort()`) and hands them to a consumer iterating it in
another thread, through a bounded queue: a slow consumer holds the pipeline back instead of letting frames pile up.
"""

from __future__ import annotations

import queue
from collections.abc import Iterable, Iterator
from fractions import Fraction
from pathlib import Path

import numpy as np

from gpen_tune.video.reader import Frame, VideoInfo

DEFAULT_SINK_DEPTH = 8      # restored frames waiting for the consumer before `write` blocks


class ArrayFrameSource:
    """Frames from `frames` (HWC RGB uint8 or uint16 arrays), timed at `fps`: frame i has pts i in 1/fps units
    unless `time_base` is given (then pts = round(i / fps / time_base)). Iterates `frames` once, lazily."""

    def __init__(self, frames: Iterable[np.ndarray], fps: float | Fraction = 30, *,
                 time_base: Fraction | None = None, expected_frames: int | None = None):
        self.fps = Fraction(fps).limit_denominator(1001000)
        if self.fps <= 0:
            raise ValueError(f"fps must be positive, got {fps}")
        self.time_base = Fraction(time_base) if time_base is not None else 1 / self.fps
        self.expected_frames = expected_frames if expected_frames is not None else _len_or_none(frames)
        self._frames = frames
        self._used = False

    def video_info(self, width: int, height: int, *, bit_depth: int = 8, codec: str = "h264") -> VideoInfo:
        """A `VideoInfo` for writing these frames to a file with `VideoWriter` (no audio, BT.709 tags)."""
        return VideoInfo(
            path=Path("<frames>"), container="frames", codec=codec, width=width, height=height, fps=self.fps,
            time_base=self.time_base, start_pts=0, frame_count=self.expected_frames, duration_s=None,
            pix_fmt="yuv420p10le" if bit_depth > 8 else "yuv420p", bit_depth=bit_depth, rotation=0,
            color_primaries=1, color_trc=1, colorspace=1, color_range=1,
        )

    def __iter__(self) -> Iterator[Frame]:
        if self._used:
            raise RuntimeError("an ArrayFrameSource iterates its frames once")
        self._used = True
        ticks = 1 / (self.fps * self.time_base)
        for i, image in enumerate(self._frames):
            image = np.asarray(image)
            if image.ndim != 3 or image.shape[2] != 3 or image.dtype not in (np.uint8, np.uint16):
                raise ValueError(f"frame {i}: expected HWC RGB uint8/uint16, got shape {image.shape} {image.dtype}")
            yield Frame(image, round(i * ticks), self.time_base)


def _len_or_none(frames) -> int | None:
    try:
        return len(frames)
    except TypeError:
        return None


class _Closed:
    pass


_END = _Closed()


class FrameQueueSink:
    """Restored frames handed back to the caller: the pipeline writes, the caller iterates (another thread).

    Iteration ends after `close()`; after `abort(reason)` it raises `RuntimeError(reason)`. `maxsize`: frames
    queued before `write` blocks.
    """

    def __init__(self, maxsize: int = DEFAULT_SINK_DEPTH):
        self._queue: queue.Queue = queue.Queue(maxsize=maxsize)
        self.frames = 0

    def write(self, image: np.ndarray, pts: int, time_base: Fraction | None = None) -> None:
        self._queue.put(Frame(image, int(pts), time_base))
        self.frames += 1

    def close(self) -> None:
        self._queue.put(_END)

    def abort(self, reason: str = "the pipeline stopped") -> None:
        self._queue.put(RuntimeError(reason))

    def __iter__(self) -> Iterator[Frame]:
        while True:
            item = self._queue.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
