"""Probe a video file and decode its frames lazily, one at a time, as RGB arrays.

Frames are "HWC, RGB, uint8" for 8-bit sources and "HWC, RGB, uint16, [0, 65535]" for sources of more than 8 bits
per sample (the scale the photo path uses for 16-bit images). Frames keep their coded orientation unless `upright`
is asked for; the rotation stays in `VideoInfo.rotation` for the writer to put back.

A packet that fails to decode in the middle of a stream is counted and its frame is filled with the previous good
frame at that packet's timestamp (so the frame count and timestamps stay those of the stream); a frame the decoder
marks corrupt (concealed errors) is passed through as decoded and counted. `VideoReader.report` says both.
"""

from __future__ import annotations

import bisect
import os
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import NamedTuple

import av
import av.error
import numpy as np
from av.video.reformatter import Interpolation

# swscale flags for 8-bit RGB <-> YUV: with the defaults each round trip darkens by about one grey level (chroma
# rounding); bilinear + accurate rounding + full chroma interpolation keeps the mean within 0.1. At 16 bits the
# defaults are unbiased and these flags garble the chroma in this FFmpeg, so they are for 8 bits only.
SWS_FLAGS_8BIT = Interpolation.BILINEAR | Interpolation.ACCURATE_RND | Interpolation.FULL_CHR_H_INT
# The largest frame read: DCI 8K (8192 x 4320), the top of H.264's and HEVC's levels. Checked from the stream's
# header before any frame is decoded: several frames are in flight at once (decoder delay, the pipeline's slots),
# so a frame near the photo limit (100 MP) would take gigabytes.
MAX_FRAME_PIXELS = 8192 * 4320
# YUV <-> RGB conversions (swscale, which releases the GIL) run on threads beside the decoder and the encoder: at
# 1080p with the flags above one takes ~4-8 ms, in the reading or encoding thread a cost added to every frame.
CONVERT_THREADS = min(4, os.cpu_count() or 1)
CONVERT_AHEAD_BYTES = 64 << 20         # RGB frames converting ahead of the one yielded / encoded: 8 at 1080p, 1 at 8K
MAX_LISTED_PTS = 64               # corrupt / filled frame timestamps kept in the report (the counts are exact)


def convert_ahead(info: VideoInfo) -> int:
    """How many frames of `info`'s size may be converting at once (1 to two per conversion thread)."""
    frame_bytes = info.width * info.height * 3 * (2 if info.bit_depth > 8 else 1)
    return max(1, min(2 * CONVERT_THREADS, CONVERT_AHEAD_BYTES // max(frame_bytes, 1)))


class VideoReadError(RuntimeError):
    """A file that cannot be read as a video; the message is one line naming the file."""


class Frame(NamedTuple):
    """One decoded frame: `image` HWC RGB (uint8, or uint16 above 8 bits), `pts` in units of `time_base`."""

    image: np.ndarray
    pts: int
    time_base: Fraction


@dataclass(frozen=True)
class SideStream:
    """An audio or subtitle stream of the source, which the writer copies or re-encodes."""

    index: int                    # stream index in the source container
    kind: str                     # "audio" | "subtitle"
    codec: str                    # codec name, e.g. "aac", "mov_text"
    language: str | None
    sample_rate: int | None = None  # audio only
    channels: int | None = None     # audio only


@dataclass(frozen=True)
class VideoInfo:
    """What the writer needs to reproduce the stream, and what progress needs for an ETA."""

    path: Path
    container: str                # demuxer name, e.g. "mov,mp4,m4a,3gp,3g2,mj2", "matroska,webm"
    codec: str                    # video codec (family) name, e.g. "h264", "hevc", "vp9", "av1"
    width: int                    # coded size (before rotation)
    height: int
    fps: Fraction                 # average frame rate (a guess for variable frame rate streams)
    time_base: Fraction           # unit of every Frame.pts
    start_pts: int | None
    frame_count: int | None       # from the container header; None when it does not say (mkv, webm)
    duration_s: float | None
    pix_fmt: str                  # e.g. "yuv420p", "yuv420p10le"
    bit_depth: int                # bits per sample of the first component
    rotation: int                 # display rotation, degrees counter-clockwise (the display matrix)
    color_primaries: int          # AVColorPrimaries / AVColorTransferCharacteristic / AVColorSpace / AVColorRange
    color_trc: int
    colorspace: int
    color_range: int
    audio: tuple[SideStream, ...] = ()
    subtitles: tuple[SideStream, ...] = ()

    @property
    def expected_frames(self) -> int | None:
        """The header's frame count, else duration x frame rate (for progress and ETA; not exact for VFR)."""
        if self.frame_count:
            return self.frame_count
        if self.duration_s and self.fps:
            return max(1, round(self.duration_s * float(self.fps)))
        return None

    @property
    def dtype(self) -> type[np.generic]:
        return np.uint16 if self.bit_depth > 8 else np.uint8


@dataclass
class DecodeReport:
    """What went wrong while decoding, for one line in the run's summary."""

    frames: int = 0
    corrupt: int = 0              # decoded frames the decoder flagged corrupt (passed through as decoded)
    filled: int = 0               # packets that failed to decode (their frame = the previous good frame)
    lost: int = 0                 # failed packets with no good frame before them to fill from (dropped)
    corrupt_pts: list[int] = field(default_factory=list)
    filled_pts: list[int] = field(default_factory=list)

    def summary(self, path: Path | str) -> str | None:
        """One line when anything went wrong, else None."""
        if not (self.corrupt or self.filled or self.lost):
            return None
        parts = []
        if self.corrupt:
            parts.append(f"{self.corrupt} corrupt frame(s) passed through as decoded")
        if self.filled:
            parts.append(f"{self.filled} undecodable frame(s) replaced by the previous frame")
        if self.lost:
            parts.append(f"{self.lost} undecodable frame(s) before the first good one dropped")
        return f"{path}: {self.frames} frames; " + ", ".join(parts)


# ----------------------------------------------------------------------------------------------------------------


def _fail(path: Path, why: str) -> VideoReadError:
    return VideoReadError(f"{path}: {why}")


def _open(path: Path) -> av.container.InputContainer:
    if not path.is_file():
        raise _fail(path, "no such file")
    try:
        return av.open(str(path), mode="r")
    except (av.error.FFmpegError, OSError, UnicodeDecodeError) as e:
        raise _fail(path, f"not a readable video ({_reason(e)}); check that the file is complete") from None


def _reason(e: BaseException) -> str:
    msg = getattr(e, "strerror", None) or str(e)
    return " ".join(str(msg).split())[:160]


def _video_stream(container, path: Path):
    if not container.streams.video:
        raise _fail(path, "has no video stream (audio or data only)")
    stream = container.streams.video[0]
    if stream.codec_context is None:
        name = getattr(stream.codec, "name", None) or "unknown"
        raise _fail(path, f"video codec '{name}' cannot be decoded by this FFmpeg build")
    return stream


def _rotation(first: av.VideoFrame, stream) -> int:
    """Counter-clockwise display rotation: the frame's display matrix, else the legacy 'rotate' tag (clockwise)."""
    rot = first.rotation
    if not rot:
        tag = stream.metadata.get("rotate")
        if tag and tag.lstrip("-").isdigit():
            rot = -int(tag)
    return int(round(rot)) % 360


def _duration(container, stream) -> float | None:
    """The video stream's own duration (mkv: its DURATION tag), else the container's (which spans all streams)."""
    if stream.duration is not None and stream.time_base:
        return float(stream.duration * stream.time_base)
    tag = stream.metadata.get("DURATION") or stream.metadata.get("duration")
    if tag and tag.count(":") == 2:
        hours, minutes, seconds = tag.split(":")
        try:
            return int(hours) * 3600 + int(minutes) * 60 + float(seconds)
        except ValueError:
            pass
    return container.duration / av.time_base if container.duration else None


def _side_streams(container) -> tuple[tuple[SideStream, ...], tuple[SideStream, ...]]:
    audio = tuple(
        SideStream(s.index, "audio", s.codec_context.codec.canonical_name if s.codec_context else "unknown",
                   s.language,
                   s.codec_context.sample_rate if s.codec_context else None,
                   s.codec_context.channels if s.codec_context else None)
        for s in container.streams.audio
    )
    subs = tuple(
        SideStream(s.index, "subtitle", s.codec_context.codec.canonical_name if s.codec_context else "unknown",
                   s.language)
        for s in container.streams.subtitles
    )
    return audio, subs


def _check_frame_size(path: Path, width: int | None, height: int | None) -> None:
    if width and height and width * height > MAX_FRAME_PIXELS:
        raise _fail(path, f"frames of {width}x{height} = {width * height / 1e6:.0f} MP are over the video limit of "
                          f"{MAX_FRAME_PIXELS / 1e6:.1f} MP (8192x4320): downscale the video first")


def _first_frame(container, stream, path: Path) -> av.VideoFrame:
    """The first decodable frame (a few broken leading packets are tolerated), or the reason there is none."""
    failures = 0
    try:
        for packet in container.demux(stream):
            try:
                for frame in stream.decode(packet):
                    return frame
            except av.error.InvalidDataError:
                failures += 1
        for frame in stream.decode(None):       # a clip shorter than the decoder's delay
            return frame
    except av.error.EOFError:
        pass
    except av.error.FFmpegError as e:
        raise _fail(path, f"unreadable after {failures} bad packet(s) ({_reason(e)}); "
                          "the file may be truncated") from None
    if failures:
        raise _fail(path, f"no frame of its {stream.codec_context.name} stream decodes; the file is corrupt")
    raise _fail(path, "has a video stream with zero frames")


def probe(path: str | Path) -> VideoInfo:
    """Read the container header and decode the first frame (to learn its rotation and prove it decodes).

    Raises `VideoReadError` (one line naming the file) for a missing, truncated or corrupt file, a file without a
    video stream or without frames, and a codec this FFmpeg build cannot decode.
    """
    path = Path(path)
    container = _open(path)
    try:
        stream = _video_stream(container, path)
        _check_frame_size(path, stream.codec_context.width, stream.codec_context.height)
        first = _first_frame(container, stream, path)
        _check_frame_size(path, first.width, first.height)
        cc = stream.codec_context
        fps = stream.average_rate or stream.guessed_rate or stream.base_rate or Fraction(25)
        duration = _duration(container, stream)
        pix_fmt = cc.pix_fmt or first.format.name
        audio, subs = _side_streams(container)
        return VideoInfo(
            path=path, container=container.format.name, codec=cc.codec.canonical_name, width=cc.width or first.width,
            height=cc.height or first.height, fps=Fraction(fps), time_base=Fraction(stream.time_base),
            start_pts=stream.start_time, frame_count=stream.frames or None, duration_s=duration, pix_fmt=pix_fmt,
            bit_depth=av.video.format.VideoFormat(pix_fmt).components[0].bits, rotation=_rotation(first, stream),
            color_primaries=cc.color_primaries or first.color_primaries, color_trc=cc.color_trc or first.color_trc,
            colorspace=cc.colorspace or first.colorspace, color_range=cc.color_range or first.color_range,
            audio=audio, subtitles=subs,
        )
    finally:
        container.close()


# ----------------------------------------------------------------------------------------------------------------


class VideoReader:
    """Frames of a video file, decoded lazily: at most the decoder's own delay of frames and `convert_ahead`
    frames converting to RGB are held at any time.

    `upright`: rotate each frame by the display rotation (multiples of 90 degrees) so faces stand up; a writer
    given the same `upright` turns them back, so the output keeps the source's coded size and rotation tag.
    `threads`: decoder threads, 0 = FFmpeg's choice.
    """

    def __init__(self, path: str | Path, *, upright: bool = False, threads: int = 0):
        self.info = probe(path)
        self.path = self.info.path
        self.upright = upright
        self.threads = threads
        self.report = DecodeReport()

    @property
    def fps(self) -> Fraction:
        return self.info.fps

    @property
    def time_base(self) -> Fraction:
        return self.info.time_base

    @property
    def expected_frames(self) -> int | None:
        return self.info.expected_frames

    def __iter__(self) -> Iterator[Frame]:
        """Each call decodes from the start; the report counts the latest pass."""
        self.report = DecodeReport()
        container = _open(self.path)
        converter = ThreadPoolExecutor(CONVERT_THREADS, thread_name_prefix="gpen-video-convert")
        try:
            stream = _video_stream(container, self.path)
            stream.thread_type = "AUTO"
            stream.thread_count = self.threads
            yield from _in_order(self._decode(container, stream, converter), self.info.time_base,
                                 convert_ahead(self.info))
        finally:
            converter.shutdown(wait=True, cancel_futures=True)     # no conversion outlives the container
            container.close()

    def _decode(self, container, stream, converter: ThreadPoolExecutor) -> Iterator[tuple[Future, int]]:
        """(each frame's RGB image to be, its pts), converted on `converter`'s threads.

        Decode in packet order, remembering each packet's pts until its frame comes out. Frames come out in pts
        order, so the pts still waiting below an output frame's belong to frames the decoder failed on (with frame
        threads the error surfaces a few packets later, so the failing send is not the culprit)."""
        waiting: list[int] = []            # pts of packets sent whose frame has not come out, sorted
        errors = 0
        last: Future | None = None
        last_pts: int | None = None
        step = _pts_step(self.info)
        try:
            for packet in container.demux(stream):
                if packet.size and packet.pts is not None and not packet.is_discard:
                    bisect.insort(waiting, packet.pts)
                try:
                    decoded = stream.decode(packet)
                except av.error.InvalidDataError:
                    errors += 1
                    continue
                for frame in decoded:
                    pts = frame.pts if frame.pts is not None else (0 if last_pts is None else last_pts + step)
                    at = bisect.bisect_left(waiting, pts)
                    if at < len(waiting) and waiting[at] == pts:
                        for missed in waiting[:at]:
                            fill = self._fill(last, missed)
                            if fill is not None:
                                yield fill
                        del waiting[:at + 1]
                    _check_frame_size(self.path, frame.width, frame.height)   # a size change mid-stream
                    image = converter.submit(self._to_array, frame)
                    if frame.is_corrupt:
                        self.report.corrupt += 1
                        _note(self.report.corrupt_pts, pts)
                    self.report.frames += 1
                    last, last_pts = image, pts
                    yield image, pts
        except av.error.FFmpegError as e:
            raise _fail(self.path, f"unreadable after frame {self.report.frames} ({_reason(e)}); "
                                   "the file may be truncated") from None
        for missed in waiting if errors else ():   # without errors, leftovers are frames the container drops
            fill = self._fill(last, missed)
            if fill is not None:
                yield fill

    def _fill(self, last: Future | None, pts: int) -> tuple[Future, int] | None:
        """The previous good frame at `pts`, or None (counted as lost) before the first good one."""
        if last is None:
            self.report.lost += 1
            return None
        self.report.filled += 1
        self.report.frames += 1
        _note(self.report.filled_pts, pts)
        return last, pts

    def _to_array(self, frame: av.VideoFrame) -> np.ndarray:
        if self.info.bit_depth > 8:
            image = frame.to_ndarray(format="rgb48le")
        else:
            image = frame.to_ndarray(format="rgb24", interpolation=SWS_FLAGS_8BIT)
        if self.upright and self.info.rotation % 90 == 0 and self.info.rotation:
            image = np.ascontiguousarray(np.rot90(image, k=self.info.rotation // 90))
        return image


def _in_order(converting: Iterator[tuple[Future, int]], time_base: Fraction, most: int) -> Iterator[Frame]:
    """The frames of `converting` in order, up to `most` of them decoded and converting ahead of the caller; a
    decode error is raised after the frames before it."""
    ahead: deque[tuple[Future, int]] = deque()
    try:
        for item in converting:
            ahead.append(item)
            while ahead and (len(ahead) > most or ahead[0][0].done()):
                image, pts = ahead.popleft()
                yield Frame(image.result(), pts, time_base)
    except VideoReadError:
        for image, pts in ahead:
            yield Frame(image.result(), pts, time_base)
        raise
    for image, pts in ahead:
        yield Frame(image.result(), pts, time_base)


def _pts_step(info: VideoInfo) -> int:
    """Timestamp units per frame, for frames the decoder hands back without a pts."""
    return max(1, round(1 / (info.fps * info.time_base))) if info.fps and info.time_base else 1


def _note(listed: list[int], pts: int) -> None:
    if len(listed) < MAX_LISTED_PTS:
        listed.append(pts)
