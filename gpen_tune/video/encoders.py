"""Which encoder writes a video, with which quality options: `pick_encoder`.

Default: the source's codec family at visually lossless quality, on the CPU encoders the PyAV wheels carry
(libx264 crf 18, libx265 crf 20, libvpx-vp9 crf 24, SVT-AV1 crf 24); NVENC (`h264_nvenc`, `hevc_nvenc`) when asked
for by name, or when the caller says it runs on a CUDA device and the NVIDIA driver opens it. A family the output
container cannot hold falls back to one it can (webm: VP9; others: H.264), with a note.
"""

from __future__ import annotations

from fractions import Fraction
from functools import cache

import av
import av.error

from gpen_tune.video.x264_cpu import x264_params
from gpen_tune.video_presets import DEFAULT_ENCODER_PRESET

OUTPUT_FORMATS = {"mp4": "mp4", "mkv": "matroska", "mov": "mov", "webm": "webm"}   # --ext -> FFmpeg muxer
VIDEO_EXTS = tuple(OUTPUT_FORMATS)

# family -> (CPU encoder, its quality option, visually lossless default, NVENC encoder or None)
FAMILIES: dict[str, tuple[str, str, float, str | None]] = {
    "h264": ("libx264", "crf", 18, "h264_nvenc"),
    "hevc": ("libx265", "crf", 20, "hevc_nvenc"),
    "vp9": ("libvpx-vp9", "crf", 24, None),
    "av1": ("libsvtav1", "crf", 24, None),
}
NVENC_CQ = {"h264_nvenc": 19, "hevc_nvenc": 21}            # NVENC constant-quality level of about the same look
EXT_FAMILIES = {                                           # families each output container holds
    "mp4": ("h264", "hevc", "av1", "vp9"),
    "mov": ("h264", "hevc"),
    "mkv": ("h264", "hevc", "vp9", "av1"),
    "webm": ("vp9", "av1"),
}
ENCODER_FAMILY = {enc: fam for fam, (enc, _, _, _) in FAMILIES.items()} | {
    nv: fam for fam, (_, _, _, nv) in FAMILIES.items() if nv
} | {"libvpx": "vp8", "libaom-av1": "av1"}


class EncoderError(ValueError):
    """An encoder that cannot be used; the message says which one to use instead."""


def family_of(codec: str) -> str:
    """Codec family of a decoder or encoder name: 'h264', 'hevc', 'vp9', 'av1', ... (the name itself otherwise)."""
    return ENCODER_FAMILY.get(codec, codec)


HARDWARE_SUFFIXES = ("_nvenc", "_qsv", "_vaapi", "_amf", "_videotoolbox")


@cache
def encoder_available(name: str) -> bool:
    """True when this FFmpeg build has the encoder and, for a hardware encoder, it opens here (NVENC needs an
    NVIDIA driver and GPU): software encoders in the build always open, so only hardware ones are tried."""
    try:
        codec = av.codec.Codec(name, "w")
    except (av.error.FFmpegError, ValueError):
        return False
    if codec.type != "video" or not name.endswith(HARDWARE_SUFFIXES):
        return True
    ctx = av.codec.CodecContext.create(codec)
    ctx.width, ctx.height, ctx.pix_fmt = 256, 256, "yuv420p"
    ctx.time_base, ctx.framerate = Fraction(1, 25), Fraction(25)
    try:
        ctx.open()
    except (av.error.FFmpegError, ValueError, OSError):
        return False
    return True


def check_encoder(name: str) -> None:
    """EncoderError (one line) unless this FFmpeg build has the video encoder `name` and it opens here: a wrong
    --codec fails before any work, not at the first video."""
    if not encoder_available(name):
        software = ", ".join(enc for enc, _, _, _ in FAMILIES.values() if encoder_available(enc))
        raise EncoderError(f"--codec {name}: no such video encoder in this FFmpeg build (PyAV), or it does not open "
                           f"here (hardware encoders need their driver); use one of {software}")


def quality_options(codec: str, crf: float | None, preset: str | None = None) -> dict[str, str]:
    """Encoder options for constant quality `crf` (None: the codec's visually lossless default); `preset`: the
    libx264/libx265 speed preset (None: medium; other encoders ignore it)."""
    if codec in NVENC_CQ:
        cq = NVENC_CQ[codec] if crf is None else crf
        return {"preset": "p5", "tune": "hq", "rc": "vbr", "cq": f"{cq:g}", "b": "0"}
    fam = family_of(codec)
    if fam not in FAMILIES:
        return {} if crf is None else {"crf": f"{crf:g}"}
    _, option, default, _ = FAMILIES[fam]
    opts = {option: f"{default if crf is None else crf:g}"}
    if codec == "libx264":
        opts["preset"] = preset or DEFAULT_ENCODER_PRESET
        opts |= x264_params()                             # off AVX-512: the same frames write the same pixels
    elif codec == "libx265":
        opts["preset"] = preset or DEFAULT_ENCODER_PRESET
        opts["x265-params"] = "log-level=error"
    elif codec == "libvpx-vp9":
        opts |= {"b": "0", "row-mt": "1", "deadline": "good", "cpu-used": "2"}
    elif codec == "libsvtav1":
        opts["preset"] = "8"
    return opts


def pick_encoder(input_codec: str, ext: str, device_type: str = "cpu", requested: str | None = None,
                 crf: float | None = None, preset: str | None = None) -> tuple[str, dict[str, str], str | None]:
    """(encoder name, its options, a one-line note or None) for a source coded with `input_codec` written as `ext`.

    `requested`: an encoder name (`libx264`, `h264_nvenc`, ...) or a family (`h264`, `hevc`, `vp9`, `av1`);
    raises `EncoderError` when it is not in this build, does not open here, or the container cannot hold it.
    `device_type` "cuda": NVENC for the H.264/HEVC families when it opens, else the CPU encoder with a note.
    `preset`: the libx264/libx265 speed preset (`encoder_preset_for`).
    """
    ext = ext.lower().lstrip(".")
    if ext not in OUTPUT_FORMATS:
        raise EncoderError(f"output extension '.{ext}' is not a video container; use one of {', '.join(VIDEO_EXTS)}")
    if requested:
        return _requested(requested, ext, crf, preset)
    note = None
    fam = family_of(input_codec)
    if fam not in EXT_FAMILIES[ext]:
        fallback = EXT_FAMILIES[ext][0]
        note = f"{input_codec} is not encoded to .{ext} here: writing {fallback} instead"
        fam = fallback
    cpu, _, _, nvenc = FAMILIES[fam]
    codec = cpu
    if device_type == "cuda" and nvenc:
        if encoder_available(nvenc):
            codec = nvenc
        else:
            note = f"{nvenc} does not open here (NVIDIA driver or GPU missing): encoding with {cpu}"
    if not encoder_available(codec):
        raise EncoderError(f"encoder {codec} is missing from this FFmpeg build; choose another with --codec")
    return codec, quality_options(codec, crf, preset), note


def _requested(requested: str, ext: str, crf: float | None, preset: str | None
               ) -> tuple[str, dict[str, str], str | None]:
    codec = FAMILIES[requested][0] if requested in FAMILIES else requested
    fam = family_of(codec)
    if fam in FAMILIES and fam not in EXT_FAMILIES[ext]:
        allowed = ", ".join(FAMILIES[f][0] for f in EXT_FAMILIES[ext])
        raise EncoderError(f"{codec} cannot go into .{ext}; use one of {allowed} or another --ext")
    if not encoder_available(codec):
        hint = " (needs an NVIDIA GPU and driver)" if codec.endswith("_nvenc") else ""
        cpu = FAMILIES.get(fam, ("libx264",))[0]
        raise EncoderError(f"encoder {codec} is not available here{hint}; use --codec {cpu}")
    return codec, quality_options(codec, crf, preset), None
