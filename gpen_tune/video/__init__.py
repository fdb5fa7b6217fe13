"""Video: decode, track faces across frames, encode back with the source's sound, timing and metadata.

* `reader`: `probe(path) -> VideoInfo` and `VideoReader(path)`, which yields `Frame(image, pts, time_base)` lazily
  (HWC RGB uint8, uint16 above 8 bits); a bad file raises `VideoReadError` in one line naming it.
* `writer`: `VideoWriter(dst, info)` writes frames at their source pts under a temporary name, renames at close,
  copies audio and subtitles (or re-encodes them once, with a note) and keeps rotation and colour tags.
* `encoders`: `pick_encoder(input_codec, ext, device_type, requested)`.
* `track`: `FaceTracker` (ids across frames, One-Euro smoothed landmarks, short gaps filled).
* `frames`: `ArrayFrameSource` (frames from any iterator of arrays) and `FrameQueueSink` (restored frames back).

Encoder by default: the source's codec family on the CPU encoders that PyAV's wheels carry, at visually lossless
quality: H.264 -> libx264 crf 18 (preset medium), HEVC -> libx265 crf 20, VP9 -> libvpx-vp9 crf 24 (constant
quality, b=0), AV1 -> SVT-AV1 crf 24; any other source codec -> H.264 (VP9 for webm). Why: keeping the family
keeps what the user chose (size, player support), and these crf levels are where the codecs' own guides put
"visually lossless", so the restored faces are not smeared by a second lossy pass. 10-bit sources stay 10-bit where
the encoder has a 10-bit mode (libx264/libx265: yuv420p10le; NVENC: p010le; this libvpx-vp9 build is 8-bit only).
NVENC (`h264_nvenc`, `hevc_nvenc`) is used when asked for by name, or with `device_type="cuda"` when the driver
opens it; it is much faster but needs a higher bitrate for the same look, so the CPU encoders stay the default
elsewhere.

Dependency: PyAV (`av`), whose wheels carry the FFmpeg libraries (no system FFmpeg needed); the alternatives are
deprecated or unmaintained (torchvision.io's video API, torchaudio.io, decord).
"""

from gpen_tune.video.encoders import VIDEO_EXTS, EncoderError, encoder_available, pick_encoder
from gpen_tune.video.frames import ArrayFrameSource, FrameQueueSink
from gpen_tune.video.reader import DecodeReport, Frame, SideStream, VideoInfo, VideoReader, VideoReadError, probe
from gpen_tune.video.track import FaceTracker, OneEuroFilter, TrackedFace
from gpen_tune.video.writer import VideoWriteError, VideoWriter

__all__ = [
    "VIDEO_EXTS", "ArrayFrameSource", "DecodeReport", "EncoderError", "FaceTracker", "Frame", "FrameQueueSink",
    "OneEuroFilter", "SideStream", "TrackedFace", "VideoInfo", "VideoReadError", "VideoReader", "VideoWriteError",
    "VideoWriter", "encoder_available", "pick_encoder", "probe",
]
