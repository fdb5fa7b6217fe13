"""Short clips made from the bundled photos, with a sine-tone audio track and subtitles, for the video tests."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import cv2
import numpy as np
from av.subtitles.subtitle import SubtitleSet
from av.video.reformatter import Colorspace

from gpen_tune.face import samples
from gpen_tune.video.writer import DEFAULT_ASS_HEADER
from gpen_tune.video.x264_cpu import x264_params

SUBTITLE_CODEC = {"mp4": "mov_text", "mov": "mov_text", "mkv": "ass", "webm": "webvtt"}
AUDIO_CODEC = {"mp4": "aac", "mov": "aac", "mkv": "aac", "webm": "libopus"}
VIDEO_CODEC = {"mp4": "libx264", "mov": "libx264", "mkv": "libx264", "webm": "libvpx-vp9"}
AUDIO_RATE = 48000
MS = Fraction(1, 1000)


def moving_frames(n: int, size: tuple[int, int] = (320, 240), photo: str = "astronaut", seed: int = 0):
    """n frames of a bundled photo, panned and zoomed a little per frame (deterministic); yields HWC RGB uint8."""
    src = samples.astronaut() if photo == "astronaut" else samples.grace_hopper()
    w, h = size
    sh, sw = src.shape[:2]
    for i in range(n):
        zoom = 1.0 + 0.1 * np.sin(i / 9.0)
        cx, cy = sw / 2 + 12 * np.sin(i / 7.0), sh / 2 + 8 * np.cos(i / 5.0)
        half_w = min(sw / 2, sh / 2 * w / h) / zoom
        half_h = half_w * h / w
        x0, y0 = max(0, int(cx - half_w)), max(0, int(cy - half_h))
        crop = src[y0:int(cy + half_h), x0:int(cx + half_w)]
        yield cv2.resize(crop, (w, h), interpolation=cv2.INTER_AREA)


def make_clip(path: Path, n: int = 30, *, size=(320, 240), fps: int = 25, pts_ms: list[int] | None = None,
              audio: bool = True, subtitles: bool = True, video: bool = True, codec: str | None = None,
              pix_fmt: str = "yuv420p", rotation: int = 0, colorspace: int | None = None,
              color_range: int | None = None, color_primaries: int | None = None, color_trc: int | None = None,
              frames=None, lossless: bool = False) -> Path:
    """Write a clip; `pts_ms`: each frame's time in milliseconds (variable frame rate), else a constant `fps`.
    `lossless` (libx264): the frames decode exactly as given. libx264 is kept off AVX-512 as the library's writer
    keeps it (`gpen_tune.video.x264_cpu`): with it, the same frames wrote other pixels from one write to the next."""
    ext = path.suffix.lstrip(".")
    pts_ms = [round(i * 1000 / fps) for i in range(n)] if pts_ms is None else pts_ms
    out = av.open(str(path), "w")
    vs = None
    if video:
        name = codec or VIDEO_CODEC[ext]
        options = ({"qp": "0"} if lossless else {}) | (x264_params() if name == "libx264" else {})
        vs = out.add_stream(name, rate=fps, options=options)
        vs.width, vs.height, vs.pix_fmt = size[0], size[1], pix_fmt
        vs.codec_context.time_base = MS
        for attr, value in (("colorspace", colorspace), ("color_range", color_range),
                            ("color_primaries", color_primaries), ("color_trc", color_trc)):
            if value is not None:
                setattr(vs, attr, value)
        if rotation:
            vs.set_display_rotation(rotation)
    a = out.add_stream(AUDIO_CODEC[ext], rate=AUDIO_RATE) if audio else None
    s = None
    if subtitles:
        s = out.add_stream(SUBTITLE_CODEC[ext])
        s.codec_context.subtitle_header = DEFAULT_ASS_HEADER
    if vs is not None:
        depth16 = "10" in pix_fmt
        for img, t in zip(frames if frames is not None else moving_frames(n, size), pts_ms, strict=False):
            if depth16 and img.dtype == np.uint8:
                img = img.astype(np.uint16) * 257
            f = av.VideoFrame.from_ndarray(img, format="rgb48le" if img.dtype == np.uint16 else "rgb24")
            f = f.reformat(format=pix_fmt, dst_colorspace=Colorspace.ITU709 if colorspace == 1 else None,
                           dst_color_range=color_range or None)
            f.pts, f.time_base = t, MS
            out.mux(vs.encode(f))
        out.mux(vs.encode(None))
    if a is not None:
        _sine(out, a, seconds=(pts_ms[-1] + 40) / 1000 if pts_ms else 1.0)
    if s is not None:
        for k, (start, end) in enumerate([(100, 500), (600, 900)]):
            sub = SubtitleSet.create(f"{k},0,Default,,0,0,0,,Line {k}".encode(), 0, end - start, pts=start * 1000)
            p = s.codec_context.encode_subtitle(sub)
            p.stream, p.pts, p.dts, p.duration, p.time_base = s, start, start, end - start, MS
            out.mux(p)
    if not pts_ms and not audio and not subtitles:
        out.start_encoding()                 # a header with a video stream and no packets: "zero frames"
    out.close()
    return path


def _sine(out, stream, seconds: float, hz: float = 440.0) -> None:
    fs = stream.codec_context.frame_size or 960
    for start in range(0, int(seconds * AUDIO_RATE), fs):
        t = (np.arange(fs) + start) / AUDIO_RATE
        samples_ = (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)[None]
        fmt = stream.codec_context.codec.audio_formats[0].name
        frame = av.AudioFrame.from_ndarray(samples_, format="fltp", layout="mono")
        frame.sample_rate, frame.pts = AUDIO_RATE, start
        if fmt != "fltp":
            frame = av.AudioResampler(format=fmt, layout="mono", rate=AUDIO_RATE).resample(frame)[0]
            frame.pts = start
        out.mux(stream.encode(frame))
    out.mux(stream.encode(None))


def packets(path: Path, kind: str) -> list[bytes]:
    """Payload bytes of every non-empty packet of the first stream of `kind` ("audio", "subtitle")."""
    with av.open(str(path)) as c:
        stream = (c.streams.audio if kind == "audio" else c.streams.subtitles)[0]
        return [bytes(p) for p in c.demux(stream) if p.size]
