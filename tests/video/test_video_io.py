"""Video decode and encode on clips made here from the bundled photos (with a sine tone and subtitles)."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
from clips import MS, make_clip, packets

from gpen_tune.video import (
    EncoderError,
    VideoReader,
    VideoReadError,
    VideoWriteError,
    VideoWriter,
    encoder_available,
    pick_encoder,
    probe,
)
from gpen_tune.video.writer import temp_path_for
from gpen_tune.video.x264_cpu import x264_params

VFR_MS = [0, 40, 80, 150, 190, 230, 330, 370, 410, 450, 520, 560, 600, 640, 700, 740, 780, 820, 900, 940]
BT709 = dict(colorspace=1, color_range=1, color_primaries=1, color_trc=1)


def _times(path: Path) -> list[Fraction]:
    return [Fraction(f.pts) * f.time_base for f in VideoReader(path)]


def _copy(src: Path, dst: Path, **kwargs) -> list[str]:
    notes: list[str] = []
    info = probe(src)
    with VideoWriter(dst, info, notify=notes.append, **kwargs) as writer:
        for image, pts, _ in VideoReader(src):
            writer.write(image, pts)
    return notes


# ----------------------------------------------------------------------------------------------------------------


def test_probe_reads_size_rate_count_duration_and_side_streams(tmp_path):
    clip = make_clip(tmp_path / "a.mp4", 30, size=(320, 240), fps=25)
    info = probe(clip)
    assert (info.width, info.height, info.codec, info.pix_fmt, info.bit_depth) == (320, 240, "h264", "yuv420p", 8)
    assert info.frame_count == 30 and info.expected_frames == 30
    assert info.fps == 25 and info.duration_s == pytest.approx(1.2, abs=0.05)
    assert [a.codec for a in info.audio] == ["aac"] and info.audio[0].sample_rate == 48000
    assert [s.codec for s in info.subtitles] == ["mov_text"]
    assert info.rotation == 0 and info.dtype is np.uint8

    mkv = probe(make_clip(tmp_path / "a.mkv", 30, fps=25))
    assert mkv.frame_count is None and mkv.expected_frames == 30      # mkv headers carry no frame count
    assert [s.codec for s in mkv.subtitles] == ["ass"]


@pytest.mark.parametrize("ext", ["mp4", "mkv"])
def test_round_trip_keeps_frames_vfr_times_audio_subtitles_rotation_and_colour(tmp_path, ext):
    src = make_clip(tmp_path / f"src.{ext}", len(VFR_MS), pts_ms=VFR_MS, rotation=90, **BT709)
    assert _times(src) == [t * MS for t in VFR_MS]                       # the source really is VFR
    dst = tmp_path / "out" / f"src.{ext}"
    notes = _copy(src, dst)
    assert notes == []                                                   # everything copied, nothing re-encoded
    a, b = probe(src), probe(dst)
    assert (b.width, b.height, b.codec, b.rotation) == (a.width, a.height, "h264", 90)
    assert (b.colorspace, b.color_range, b.color_primaries, b.color_trc) == (1, 1, 1, 1)
    assert _times(dst) == _times(src)
    assert packets(dst, "audio") == packets(src, "audio") and len(packets(src, "audio")) > 10
    assert packets(dst, "subtitle") == packets(src, "subtitle")
    assert not list(dst.parent.glob(".*partial*"))


def test_round_trip_pixels_stay_close_without_a_colour_shift(tmp_path):
    src = make_clip(tmp_path / "src.mkv", 10, audio=False, subtitles=False, **BT709)
    dst = tmp_path / "out.mkv"
    _copy(src, dst)
    a = np.stack([f.image for f in VideoReader(src)]).astype(np.float64)
    b = np.stack([f.image for f in VideoReader(dst)]).astype(np.float64)
    assert np.abs(b - a).mean() < 2.0                                    # one crf-18 pass
    shift = (b - a).mean(axis=(0, 1, 2))                                 # BT.601 for a BT.709 clip: 2 levels
    assert np.abs(shift).max() < 0.3, shift


def test_frames_keep_their_order_through_the_conversion_threads(tmp_path):
    """The reader and the writer convert colours on threads, several frames ahead: every frame still comes out
    as itself, at its own time (frames that differ only in grey level, more of them than are converted at once)."""
    n = 40
    greys = [(37 * i) % 220 + 16 for i in range(n)]                    # no two neighbours alike
    frames = [np.full((96, 128, 3), g, np.uint8) for g in greys]
    src = make_clip(tmp_path / "src.mkv", n, size=(128, 96), audio=False, subtitles=False, frames=frames)
    read = list(VideoReader(src))
    assert [int(round(f.image.mean())) for f in read] == pytest.approx(greys, abs=2)
    dst = tmp_path / "out.mkv"
    with VideoWriter(dst, probe(src), crf=0) as writer:
        for f in read:
            writer.write(f.image, f.pts)
    back = list(VideoReader(dst))
    assert [f.pts for f in back] == [f.pts for f in read]
    assert [int(round(f.image.mean())) for f in back] == pytest.approx(greys, abs=2)


def test_webm_output_reencodes_audio_and_converts_subtitles_once(tmp_path):
    src = make_clip(tmp_path / "src.mp4", 20)
    dst = tmp_path / "src.webm"
    notes = _copy(src, dst)
    assert len([n for n in notes if "audio" in n and "libopus" in n]) == 1
    assert any("vp9" in n for n in notes) and any("webvtt" in n for n in notes)
    info = probe(dst)
    assert (info.codec, [x.codec for x in info.audio], [s.codec for s in info.subtitles]) == \
        ("vp9", ["opus"], ["webvtt"])
    assert len(_times(dst)) == 20 and _times(dst) == _times(src)


@pytest.mark.skipif(not any(f.name == "yuv420p10le" for f in av.codec.Codec("libx264", "w").video_formats),
                    reason="this PyAV wheel's libx264 has no 10-bit mode")
def test_10bit_stays_10bit(tmp_path):
    src = make_clip(tmp_path / "src.mkv", 8, pix_fmt="yuv420p10le", audio=False, subtitles=False)
    info = probe(src)
    assert (info.pix_fmt, info.bit_depth, info.dtype) == ("yuv420p10le", 10, np.uint16)
    frame = next(iter(VideoReader(src)))
    assert frame.image.dtype == np.uint16 and frame.image.max() > 255
    dst = tmp_path / "out.mp4"
    _copy(src, dst)
    out = probe(dst)
    assert (out.pix_fmt, out.bit_depth) == ("yuv420p10le", 10)


def test_upright_frames_stand_up_and_are_turned_back(tmp_path):
    src = make_clip(tmp_path / "src.mp4", 5, size=(320, 240), rotation=90, audio=False, subtitles=False)
    frames = list(VideoReader(src, upright=True))
    assert frames[0].image.shape == (320, 240, 3)
    coded = next(iter(VideoReader(src)))
    assert np.array_equal(frames[0].image, np.rot90(coded.image))
    dst = tmp_path / "out.mp4"
    with VideoWriter(dst, probe(src), upright=True) as writer:
        for image, pts, _ in frames:
            writer.write(image, pts)
    info = probe(dst)
    assert (info.width, info.height, info.rotation) == (320, 240, 90)


# ----------------------------------------------------------------------------------------------------------------


def _bad_files(tmp_path: Path) -> dict[str, Path]:
    good = make_clip(tmp_path / "good.mp4", 30)
    truncated = tmp_path / "truncated.mp4"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    text = tmp_path / "notes.mp4"
    text.write_text("not a video at all\n" * 20)
    audio_only = make_clip(tmp_path / "audio_only.mkv", 30, video=False, subtitles=False)
    empty = make_clip(tmp_path / "empty.mkv", 0, pts_ms=[], audio=True, subtitles=False)
    return {"truncated": truncated, "text": text, "audio only": audio_only, "zero frames": empty,
            "missing": tmp_path / "missing.mp4"}


def test_bad_files_raise_one_line_naming_the_file(tmp_path):
    for kind, path in _bad_files(tmp_path).items():
        with pytest.raises(VideoReadError) as err:
            probe(path)
        msg = str(err.value)
        assert str(path) in msg and "\n" not in msg, (kind, msg)
    with pytest.raises(VideoReadError, match="no video stream"):
        probe(tmp_path / "audio_only.mkv")
    with pytest.raises(VideoReadError, match="zero frames"):
        probe(tmp_path / "empty.mkv")


def _corrupt_packet(src: Path, dst: Path, index: int) -> None:
    """Copy `src` with the second half of video packet `index` (in file order) overwritten with noise."""
    with av.open(str(src)) as c:
        spans = [(p.pos, p.size) for p in c.demux(c.streams.video[0]) if p.size]
    pos, size = spans[index]
    data = bytearray(src.read_bytes())
    data[pos + size // 2: pos + size] = np.random.default_rng(1).integers(0, 256, size - size // 2, np.uint8).tobytes()
    dst.write_bytes(bytes(data))


def test_corrupt_frame_in_the_middle_is_counted_and_passed_through(tmp_path):
    frames = [np.random.default_rng(i).integers(0, 256, (240, 320, 3), np.uint8) for i in range(4)]
    noisy = (np.roll(frames[i % 4], 3 * i, axis=1) for i in range(40))   # big packets: the damage shows
    src = make_clip(tmp_path / "src.mkv", 40, frames=noisy, audio=False, subtitles=False)
    bad = tmp_path / "bad.mkv"
    _corrupt_packet(src, bad, 20)
    reader = VideoReader(bad)
    times = [Fraction(f.pts) * f.time_base for f in reader]
    assert len(times) == 40 and times == _times(src)                    # every frame, at its own time
    assert reader.report.filled + reader.report.corrupt >= 1
    assert str(bad) in reader.report.summary(bad)
    assert VideoReader(src).report.summary(src) is None


# ----------------------------------------------------------------------------------------------------------------


def test_exception_mid_write_leaves_neither_output_nor_temp(tmp_path):
    src = make_clip(tmp_path / "src.mp4", 20)
    dst = tmp_path / "out" / "src.mp4"
    notes: list[str] = []
    with pytest.raises(RuntimeError, match="stop here"):
        with VideoWriter(dst, probe(src), notify=notes.append) as writer:
            for i, (image, pts, _) in enumerate(VideoReader(src)):
                if i == 10:
                    raise RuntimeError("stop here")
                writer.write(image, pts)
    assert not dst.exists() and not temp_path_for(dst).exists()
    assert list(dst.parent.iterdir()) == []
    assert any("no partial file" in n for n in notes)


def test_temp_file_exists_only_while_writing(tmp_path):
    src = make_clip(tmp_path / "src.mkv", 60, audio=False, subtitles=False)   # past the encoder's lookahead
    dst = tmp_path / "out.mkv"
    writer = VideoWriter(dst, probe(src))
    for image, pts, _ in VideoReader(src):
        writer.write(image, pts)
    assert temp_path_for(dst).exists() and not dst.exists()
    assert writer.close() == dst
    assert dst.exists() and not temp_path_for(dst).exists()


def test_writer_refuses_an_encoder_the_container_cannot_hold(tmp_path):
    src = make_clip(tmp_path / "src.mkv", 3, audio=False, subtitles=False)
    with pytest.raises(VideoWriteError, match="libx264 cannot go into .webm"):
        VideoWriter(tmp_path / "out.webm", probe(src), codec="libx264")
    assert list(tmp_path.glob(".*")) == []


# ----------------------------------------------------------------------------------------------------------------


def test_pick_encoder_keeps_the_family_at_visually_lossless_quality():
    assert pick_encoder("h264", "mp4") == ("libx264", {"crf": "18", "preset": "medium"} | x264_params(), None)
    codec, opts, note = pick_encoder("hevc", "mkv")
    assert (codec, opts["crf"], note) == ("libx265", "20", None)
    codec, opts, note = pick_encoder("h264", "webm")
    assert (codec, opts["crf"], opts["b"]) == ("libvpx-vp9", "24", "0") and "vp9" in note
    assert pick_encoder("mpeg4", "mov")[0] == "libx264"
    assert pick_encoder("h264", "mkv", crf=23)[1]["crf"] == "23"
    assert pick_encoder("vp9", "mp4", requested="h264")[0] == "libx264"
    with pytest.raises(EncoderError, match="not a video container"):
        pick_encoder("h264", "avi")


@pytest.mark.skipif(encoder_available("h264_nvenc"), reason="NVENC opens here")
def test_nvenc_without_a_gpu_is_refused_by_name_and_skipped_by_default():
    with pytest.raises(EncoderError, match="h264_nvenc is not available here.*--codec libx264"):
        pick_encoder("h264", "mp4", requested="h264_nvenc")
    codec, _, note = pick_encoder("h264", "mp4", device_type="cuda")
    assert codec == "libx264" and "h264_nvenc" in note
