"""libx264 kept off AVX-512: the same frames write the same pixels every time, and x264 is never told of an
instruction set the CPU lacks."""

from __future__ import annotations

import hashlib

import numpy as np
from clips import make_clip, moving_frames

from gpen_tune.video import VideoReader, VideoWriter, pick_encoder, probe
from gpen_tune.video.x264_cpu import x264_asm, x264_params

ZEN4 = ("flags : fpu vme sse sse2 mmxext pni ssse3 fma sse4_1 sse4_2 avx abm sse4a bmi1 avx2 bmi2 avx512f avx512dq "
        "avx512bw avx512vl avx512_bf16")
SKYLAKE_CLIENT = "flags : fpu sse sse2 pni ssse3 fma sse4_1 sse4_2 avx abm bmi1 avx2 bmi2"
BULLDOZER_AVX512 = "flags : sse sse2 mmxext pni ssse3 sse4_1 sse4_2 avx xop fma4 abm avx512f"     # made up: XOP kept
ARM = "Features : fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp bf16"


def test_the_list_names_every_set_the_cpu_has_but_avx512():
    assert x264_asm(ZEN4) == "MMX2,SSE,SSE2,SSE2Fast,SSE3,SSSE3,SSE4,SSE4.2,AVX,FMA3,BMI1,BMI2,AVX2,LZCNT"
    assert x264_asm(BULLDOZER_AVX512) == "MMX2,SSE,SSE2,SSE2Fast,SSE3,SSSE3,SSE4,SSE4.2,AVX,XOP,FMA4,LZCNT"
    assert x264_asm("flags : sse sse2 avx512f") == "MMX2,SSE,SSE2"             # no AVX: SSE2 not marked fast


def test_without_avx512_x264_picks_for_itself():
    assert x264_asm(SKYLAKE_CLIENT) is None
    assert x264_asm(ARM) is None
    assert x264_asm("") is None


def test_the_h264_writer_carries_the_hosts_list():
    codec, options, _ = pick_encoder("h264", "mp4")
    assert codec == "libx264" and {k: options[k] for k in ("crf", "preset")} == {"crf": "18", "preset": "medium"}
    assert {k: v for k, v in options.items() if k == "x264-params"} == x264_params()
    assert "asm" not in pick_encoder("hevc", "mkv")[1].get("x265-params", "")           # x265: its own sets


def _decoded_digest(path) -> str:
    return hashlib.sha256(np.stack([f.image for f in VideoReader(path)]).tobytes()).hexdigest()


def test_the_same_frames_write_the_same_pixels_every_time(tmp_path):
    """A small clip at the default crf 18: with x264's AVX-512 code this host wrote other pixels most times
    (benchmarks/results/20261207-191640_encoder_repeat.json: 6 outputs in 10 writes)."""
    rng = np.random.default_rng(0)
    frames = [np.clip(f + rng.normal(0, 2.0, f.shape), 0, 255).astype(np.uint8)
              for f in moving_frames(24, (480, 270))]
    src = make_clip(tmp_path / "src.mp4", 24, size=(480, 270), audio=False, subtitles=False, frames=frames,
                    lossless=True)
    read = list(VideoReader(src))
    digests = set()
    for k in range(12):
        dst = tmp_path / f"out{k}.mp4"
        with VideoWriter(dst, probe(src)) as writer:
            for f in read:
                writer.write(f.image, f.pts)
        digests.add(_decoded_digest(dst))
    assert len(digests) == 1, f"{len(digests)} different outputs in 12 writes of the same frames"
