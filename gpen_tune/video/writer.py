"""Encode frames back into a video beside the source's audio and subtitles, atomically.

The file is written under a hidden temporary name in the output folder and renamed at `close()`; `abort()` (or an
exception inside `with VideoWriter(...)`) deletes it, so a run leaves the whole video or nothing. Every frame keeps
the pts it is given (the source's, so variable frame rate survives); rotation and colour tags are the source's.
Audio and subtitle packets are copied unchanged where the output container holds their codec, else re-encoded
(audio to AAC, or Opus for webm; text subtitles to the container's text codec) with one note; they are read from
the source alongside the video, a little at a time, so memory does not grow with the length.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import av.error
import numpy as np
from av.video.reformatter import Colorspace

from gpen_tune.imageio import commit, video_temp_path
from gpen_tune.video.encoders import OUTPUT_FORMATS, EncoderError, pick_encoder
from gpen_tune.video.reader import CONVERT_THREADS, SWS_FLAGS_8BIT, VideoInfo, convert_ahead

AUDIO_REENCODE = {"webm": ("libopus", 48000, 960)}           # ext -> (encoder, sample rate, samples per frame)
AUDIO_DEFAULT = ("aac", None, 1024)                          # None: keep the source's sample rate
TEXT_SUBTITLE = {"mp4": "mov_text", "mov": "mov_text", "mkv": "ass", "webm": "webvtt"}
# AVColorSpace (stream tag) -> swscale matrix for RGB -> YUV; others: swscale's default (BT.601), as on decode
SWS_MATRIX = {1: Colorspace.ITU709, 4: Colorspace.FCC, 5: Colorspace.ITU601, 6: Colorspace.ITU601,
              7: Colorspace.SMPTE240M, 9: Colorspace.BT2020, 10: Colorspace.BT2020}
DEFAULT_ASS_HEADER = (
    b"[Script Info]\nScriptType: v4.00+\nPlayResX: 384\nPlayResY: 288\n\n[V4+ Styles]\n"
    b"Format: Name, Fontname, Fontsize, PrimaryColour, SecondaryColour, OutlineColour, BackColour, Bold, Italic, "
    b"Underline, StrikeOut, ScaleX, ScaleY, Spacing, Angle, BorderStyle, Outline, Shadow, Alignment, MarginL, "
    b"MarginR, MarginV, Encoding\nStyle: Default,Arial,16,&Hffffff,&Hffffff,&H0,&H0,0,0,0,0,100,100,0,0,1,1,0,2,"
    b"10,10,10,0\n\n[Events]\nFormat: Layer, Start, End, Style, Name, MarginL, MarginR, MarginV, Effect, Text\n"
)


class VideoWriteError(RuntimeError):
    """The output could not be written; the message is one line naming the file (and that none was left)."""


def default_notify(msg: str) -> None:
    print(f"notice: {msg}", file=sys.stderr, flush=True)


temp_path_for = video_temp_path       # the hidden name a video is written under before the rename

def pick_pix_fmt(codec: str, src_pix_fmt: str, bit_depth: int) -> tuple[str, str | None]:
    """The source's pixel format when the encoder takes it, else 4:2:0 at the source's depth where possible."""
    formats = [f.name for f in (av.codec.Codec(codec, "w").video_formats or ())]
    src = src_pix_fmt.replace("yuvj", "yuv")                 # yuvj*: deprecated names of full-range yuv*
    if not formats or src in formats:
        return src, None
    if bit_depth > 8:
        for cand in ("yuv420p10le", "p010le"):
            if cand in formats:
                return cand, None
        return "yuv420p", f"{codec} has no 10-bit mode here: written as 8-bit"
    return ("yuv420p" if "yuv420p" in formats else formats[0]), None


@dataclass
class _Plan:
    """What happens to one source stream's packets."""

    kind: str                                  # "copy" | "audio" (re-encoded) | "subtitle" (converted)
    stream: object                             # the output stream
    resampler: av.AudioResampler | None = None
    rate: int = 0                              # output sample rate (audio)
    next_pts: int | None = None                # next output audio pts, in 1/rate


class _SideStreams:
    """The source's audio and subtitle streams: copied packets or re-encoded ones, muxed in time order."""

    def __init__(self, out, info: VideoInfo, ext: str, notes: list[str]):
        self.out = out
        self.plans: dict[int, _Plan] = {}      # source stream index -> plan
        self.source = None
        self.pending = None
        self.packets: Iterator | None = None
        if not (info.audio or info.subtitles):
            return
        self.source = av.open(str(info.path))
        streams = []
        for src in list(self.source.streams.audio) + list(self.source.streams.subtitles):
            plan = self._plan(src, ext, notes)
            if plan is not None:
                self.plans[src.index] = plan
                streams.append(src)
        self.packets = self.source.demux(*streams) if streams else None

    def _plan(self, src, ext: str, notes: list[str]):
        name = src.codec_context.name if src.codec_context else None
        if name and name in self.out.supported_codecs:
            return _Plan("copy", self.out.add_stream_from_template(src))
        if src.type == "audio":
            enc, rate, frame_size = AUDIO_REENCODE.get(ext, AUDIO_DEFAULT)
            rate = rate or src.codec_context.sample_rate
            stream = self.out.add_stream(enc, rate=rate)
            layout = src.codec_context.layout.name if src.codec_context.channels <= 2 else "stereo"
            stream.layout = layout
            fmt = av.codec.Codec(enc, "w").audio_formats[0].name
            resampler = av.AudioResampler(format=fmt, layout=layout, rate=rate, frame_size=frame_size)
            notes.append(f"audio stream {src.index} ({name}) cannot go into .{ext}: re-encoded to {enc}")
            return _Plan("audio", stream, resampler, rate)
        if src.codec_context is not None and av.codec.Codec(name, "r").text_sub:
            stream = self.out.add_stream(TEXT_SUBTITLE[ext])
            stream.codec_context.subtitle_header = src.codec_context.subtitle_header or DEFAULT_ASS_HEADER
            notes.append(f"subtitle stream {src.index} ({name}) cannot go into .{ext}: "
                         f"converted to {TEXT_SUBTITLE[ext]}")
            return _Plan("subtitle", stream)
        notes.append(f"subtitle stream {src.index} ({name}, a picture format) cannot go into .{ext}: left out")
        return None

    def mux_until(self, seconds: float | None) -> None:
        """Mux source packets up to `seconds` of stream time (None: all that are left)."""
        while self.packets is not None:
            if self.pending is None:
                self.pending = next(self.packets, None)
                if self.pending is None:
                    self.packets = None
                    break
            packet = self.pending
            if packet.pts is not None and seconds is not None and float(packet.pts * packet.time_base) > seconds:
                return
            self.pending = None
            if packet.size:
                self._mux(packet)

    def _mux(self, packet) -> None:
        plan = self.plans[packet.stream.index]
        stream = plan.stream
        if plan.kind == "copy":
            packet.stream = stream
            self.out.mux(packet)
        elif plan.kind == "audio":
            for frame in packet.decode():
                self._encode_audio(plan, frame)
        else:
            subs = packet.stream.codec_context.decode2(packet)
            if subs is None or not len(subs):
                return
            out_packet = stream.codec_context.encode_subtitle(subs)
            out_packet.stream = stream
            out_packet.pts = out_packet.dts = packet.pts
            out_packet.duration = packet.duration
            out_packet.time_base = packet.time_base
            self.out.mux(out_packet)

    def _encode_audio(self, plan: _Plan, frame) -> None:
        if plan.next_pts is None:                # start where the source's audio starts
            plan.next_pts = round(frame.pts * frame.time_base * plan.rate) if frame.pts is not None else 0
        for out_frame in plan.resampler.resample(frame):
            self._encode_resampled(plan, out_frame)

    def _encode_resampled(self, plan: _Plan, out_frame) -> None:
        out_frame.pts, out_frame.time_base = plan.next_pts or 0, Fraction(1, plan.rate)
        plan.next_pts = (plan.next_pts or 0) + out_frame.samples
        self.out.mux(plan.stream.encode(out_frame))

    def finish(self) -> None:
        self.mux_until(None)
        for plan in self.plans.values():
            if plan.kind == "audio":
                for out_frame in plan.resampler.resample(None):
                    self._encode_resampled(plan, out_frame)
                self.out.mux(plan.stream.encode(None))

    def close(self) -> None:
        if self.source is not None:
            self.source.close()
            self.source = None


class VideoWriter:
    """Frames (HWC RGB uint8, or uint16 for 10-bit output) with their source pts -> `dst`, written atomically.

    `info`: the source's `VideoInfo` (size, time base, rate, rotation, colour, side streams). `codec`/`crf`: see
    `pick_encoder`; `device_type` "cuda" lets it pick NVENC; `encoder_preset`: x264/x265's speed preset.
    `copy_streams`: bring the source's audio and subtitles along. `upright`: frames come rotated upright
    (`VideoReader(upright=True)`) and are turned back.
    `notes` collects the one-line notices (also sent to `notify`).
    """

    def __init__(self, dst: str | Path, info: VideoInfo, *, codec: str | None = None, crf: float | None = None,
                 device_type: str = "cpu", copy_streams: bool = True, upright: bool = False,
                 notify: Callable[[str], None] = default_notify, replace: bool = True,
                 encoder_preset: str | None = None):
        self.dst = Path(dst)
        self.replace = replace            # False: a file that appears at dst meanwhile is not replaced
        self.info = info
        self.upright = upright
        self.notify = notify
        self.notes: list[str] = []
        self.frames = 0                   # frames encoded
        self._converting: deque[tuple[Future, int]] = deque()      # (the YUV frame to be, pts), in order
        self._converter: ThreadPoolExecutor | None = None
        self._ahead = convert_ahead(info)
        ext = self.dst.suffix.lower().lstrip(".")
        try:
            self.codec, options, note = pick_encoder(info.codec, ext, device_type, codec, crf, encoder_preset)
        except EncoderError as e:
            raise VideoWriteError(f"{self.dst}: {e}") from None
        self.pix_fmt, depth_note = pick_pix_fmt(self.codec, info.pix_fmt, info.bit_depth)
        self.notes += [n for n in (note, depth_note) if n]
        self.tmp = temp_path_for(self.dst)
        self.dst.parent.mkdir(parents=True, exist_ok=True)
        self.out = av.open(str(self.tmp), mode="w", format=OUTPUT_FORMATS[ext])
        self._closed = False
        try:
            self.video = self._add_video(options)
            self.side = _SideStreams(self.out, info, ext, self.notes) if copy_streams else None
        except BaseException:
            self.abort(quiet=True)
            raise
        for n in self.notes:
            notify(f"{self.dst}: {n}")

    def _add_video(self, options: dict[str, str]):
        info = self.info
        stream = self.out.add_stream(self.codec, rate=info.fps, options=options)
        stream.width, stream.height, stream.pix_fmt = info.width, info.height, self.pix_fmt
        stream.codec_context.time_base = info.time_base       # frames keep the source's pts exactly
        stream.color_primaries, stream.color_trc = info.color_primaries, info.color_trc
        stream.colorspace, stream.color_range = info.colorspace, info.color_range
        if info.rotation:
            stream.set_display_rotation(info.rotation)
        if self.codec.startswith(("libx265", "hevc")) and self.out.format.name in ("mp4", "mov"):
            stream.codec_tag = "hvc1"                          # the tag Apple players need for HEVC in mp4/mov
        return stream

    def write(self, image: np.ndarray, pts: int) -> None:
        """Encode one frame at `pts` (units of `info.time_base`); frames must come in presentation order.

        The frame is converted to the encoder's pixel format on a thread and encoded in order a few frames later
        (by a later `write` or by `close`): `image` must not be changed after this call."""
        if self._closed:
            raise VideoWriteError(f"{self.dst}: write after close")
        if self.upright and self.info.rotation % 90 == 0 and self.info.rotation:
            image = np.rot90(image, k=-(self.info.rotation // 90))
        h, w = image.shape[:2]
        if (w, h) != (self.info.width, self.info.height):
            raise ValueError(f"frame is {w}x{h}, the video is {self.info.width}x{self.info.height}")
        if self._converter is None:
            self._converter = ThreadPoolExecutor(CONVERT_THREADS, thread_name_prefix="gpen-video-convert")
        self._converting.append((self._converter.submit(self._convert, image), int(pts)))
        while self._converting and (len(self._converting) > self._ahead or self._converting[0][0].done()):
            self._encode_next()

    def _convert(self, image: np.ndarray) -> av.VideoFrame:
        deep = image.dtype == np.uint16
        frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb48le" if deep else "rgb24")
        return frame.reformat(format=self.pix_fmt, dst_colorspace=SWS_MATRIX.get(self.info.colorspace),
                              dst_color_range=self.info.color_range or None,
                              interpolation=None if deep else SWS_FLAGS_8BIT)

    def _encode_next(self) -> None:
        converted, pts = self._converting.popleft()
        frame = converted.result()
        frame.pts, frame.time_base = pts, self.info.time_base
        self.out.mux(self.video.encode(frame))
        self.frames += 1
        if self.side is not None:
            self.side.mux_until(float(pts * self.info.time_base))

    def _stop_converting(self) -> None:
        for converted, _ in self._converting:
            converted.cancel()
        self._converting.clear()
        if self._converter is not None:
            self._converter.shutdown(wait=True)
            self._converter = None

    def close(self) -> Path:
        """Flush the encoder, add the rest of the audio and subtitles, and rename the file into place."""
        if self._closed:
            return self.dst
        if self.frames == 0 and not self._converting:
            self.abort(quiet=True)
            raise VideoWriteError(f"{self.dst}: no frames were written; no file left")
        try:
            while self._converting:                  # the frames still converting, in order
                self._encode_next()
            self._stop_converting()
            self.out.mux(self.video.encode(None))
            if self.side is not None:
                self.side.finish()
            self.out.close()
        except (av.error.FFmpegError, OSError, ValueError) as e:
            self.abort(quiet=True)
            raise VideoWriteError(f"{self.dst}: encoding failed ({' '.join(str(e).split())[:160]}); "
                                  "no partial file left") from None
        finally:
            if self.side is not None:
                self.side.close()
        self._closed = True
        try:
            commit(self.tmp, self.dst, self.replace)
        except OSError:
            self.tmp.unlink(missing_ok=True)
            raise
        return self.dst

    def abort(self, quiet: bool = False) -> None:
        """Drop the output: the temporary file is deleted and no file appears at `dst`."""
        if self._closed:
            return
        self._closed = True
        self._stop_converting()
        for closer in (getattr(self, "side", None), self.out):
            try:
                if closer is not None:
                    closer.close()
            except (av.error.FFmpegError, OSError, ValueError):
                pass
        self.tmp.unlink(missing_ok=True)
        if not quiet:
            self.notify(f"{self.dst}: stopped after {self.frames} frames; no partial file written")

    def __enter__(self) -> VideoWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
