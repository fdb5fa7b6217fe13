"""Videos through the one pipeline: the CLI and `enhance_video` on clips made here from the bundled photos (with
a sine-tone audio track and subtitles), a tiny synthetic GPEN and the offline MTCNN on the CPU."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import av
import numpy as np
import pytest
import typer
from PIL import Image
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))

from clips import make_clip, moving_frames, packets  # noqa: E402

from gpen_tune.cli import app  # noqa: E402
from gpen_tune.face import samples  # noqa: E402
from gpen_tune.load import load_model  # noqa: E402
from gpen_tune.model.configs import GPENConfig  # noqa: E402
from gpen_tune.pipeline.api import Pipeline  # noqa: E402
from gpen_tune.pipeline.settings import EnhanceSettings  # noqa: E402
from gpen_tune.pipeline.video import enhance_frames, enhance_video  # noqa: E402
from gpen_tune.video.encoders import pick_encoder  # noqa: E402
from gpen_tune.video.x264_cpu import x264_params  # noqa: E402
from gpen_tune.video_presets import ENCODER_PRESETS, encoder_preset_for  # noqa: E402

COMMON = ["--weights", "synthetic", "--model", "GPEN-BFR-256", "--detector", "mtcnn", "--device", "cpu"]


def invoke(args: list[str]):
    command = typer.main.get_command(app)
    argv = (["enhance"] if hasattr(command, "commands") else []) + args
    return CliRunner().invoke(app, argv, catch_exceptions=False)


def decoded(path: Path) -> tuple[list[np.ndarray], list[int]]:
    with av.open(str(path)) as c:
        frames = [(f.to_ndarray(format="rgb24"), f.pts) for f in c.decode(video=0)]
    return [f for f, _ in frames], [p for _, p in frames]


@pytest.fixture(scope="module")
def pipeline():
    model = load_model("synthetic", model=GPENConfig(64, narrow=0.25), device="cpu")
    with Pipeline(EnhanceSettings(device="cpu", detector="mtcnn", batch_size=8), model=model) as pipe:
        yield pipe


@pytest.mark.parametrize("path", ["--serial", "--no-serial"])     # one step at a time, and the pipelined threads
def test_cli_restores_a_clip_keeping_frames_timing_and_sound(tmp_path, path):
    src = make_clip(tmp_path / "clip.mp4", n=12, size=(320, 240), pts_ms=[0, 40, 80, 150, 190, 230, 300, 340,
                                                                           380, 420, 500, 540])   # variable rate
    out = tmp_path / "out"
    res = invoke([str(src), "-o", str(out), path, *COMMON])
    assert res.exit_code == 0, res.output
    dst = out / "clip.mp4"
    a, pts_a = decoded(src)
    b, pts_b = decoded(dst)
    assert len(b) == len(a) == 12 and b[0].shape == a[0].shape
    with av.open(str(src)) as c1, av.open(str(dst)) as c2:
        s1, s2 = c1.streams.video[0], c2.streams.video[0]
        assert [p * s1.time_base for p in pts_a] == [p * s2.time_base for p in pts_b]      # the same timestamps
    assert packets(dst, "audio") == packets(src, "audio")                                     # sound copied
    # the face changed, the background (corners, far from the face) only by the encoder's rounding
    face = np.abs(b[5][60:180, 110:210].astype(int) - a[5][60:180, 110:210].astype(int)).mean()
    corner = np.abs(b[5][:40, :40].astype(int) - a[5][:40, :40].astype(int)).mean()
    assert face > 5 and face > 3 * corner and corner < 4, (face, corner)
    assert not list(out.glob(".*"))                                                           # no temp left


def test_cli_mixes_photos_and_videos_and_reports_bad_videos(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    make_clip(folder / "clip.mkv", n=6)
    Image.fromarray(samples.astronaut()).save(folder / "photo.png")
    (folder / "broken.mp4").write_bytes(make_clip(tmp_path / "whole.mp4", n=6).read_bytes()[:900])
    (folder / "notes.mov").write_text("not a video")
    out = tmp_path / "out"
    res = invoke([str(folder), "-o", str(out), *COMMON])
    assert res.exit_code == 1
    assert sorted(p.name for p in out.iterdir()) == ["clip.mkv", "photo.png"]
    for name in ("broken.mp4", "notes.mov"):
        lines = [ln for ln in res.output.splitlines() if name in ln and "failed" in ln]
        assert len(lines) == 1, res.output
    assert len(decoded(out / "clip.mkv")[0]) == 6


def test_ext_applies_to_videos_only_when_it_is_a_video_format(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    make_clip(folder / "clip.mp4", n=4, audio=False, subtitles=False)
    Image.fromarray(np.full((64, 80, 3), 50, np.uint8)).save(folder / "wall.png")
    res = invoke([str(folder), "-o", str(tmp_path / "out"), "--ext", "mkv", *COMMON])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["clip.mkv", "wall.png"]


def _flicker(frames: list[np.ndarray], box: tuple[int, int, int, int]) -> float:
    x0, y0, x1, y1 = box
    crops = [f[y0:y1, x0:x1].astype(np.float32) for f in frames]
    return float(np.mean([np.abs(b - a).mean() for a, b in zip(crops, crops[1:], strict=False)]))


@pytest.mark.slow
def test_smoothing_lowers_the_frame_to_frame_change_inside_the_face(tmp_path, pipeline):
    """A still face with per-frame sensor noise: the detector's landmarks jitter, so the restored face jitters;
    smoothed landmarks make consecutive restored faces closer."""
    rng = np.random.default_rng(0)
    still = next(moving_frames(1, (320, 240)))
    noisy = [np.clip(still.astype(np.int16) + rng.normal(0, 6, still.shape), 0, 255).astype(np.uint8)
             for _ in range(24)]
    src = make_clip(tmp_path / "still.mkv", n=24, frames=noisy, audio=False, subtitles=False, codec="libx264")
    box = (110, 60, 210, 180)
    results = {}
    for smooth in (True, False):
        dst = tmp_path / f"out_{smooth}.mkv"
        enhance_video(src, dst, pipeline, smooth=smooth, crf=0)
        results[smooth] = _flicker(decoded(dst)[0], box)
    inputs = _flicker(decoded(src)[0], box)
    assert results[True] < results[False], (results, inputs)


@pytest.mark.slow
def test_memory_stays_flat_whatever_the_length(tmp_path, pipeline):
    """The memory a 40-frame and a 160-frame clip hold at their peak is about the same: frames are streamed, never
    all held. Measured as the peak of Python-tracked memory (numpy arrays and torch's CPU tensors included)
    during each run; the process RSS on top of that follows the threads' allocator arenas, not the frame count."""
    import tracemalloc

    def run(n: int) -> float:
        src = make_clip(tmp_path / f"c{n}.mp4", n=n, audio=False, subtitles=False)
        tracemalloc.reset_peak()
        start = tracemalloc.get_traced_memory()[0]
        result = enhance_video(src, tmp_path / f"o{n}.mp4", pipeline)
        assert result.frames == n and result.ok
        return (tracemalloc.get_traced_memory()[1] - start) / 2**20                          # MiB

    tracemalloc.start()
    try:
        run(20)
        short, long = run(40), run(160)
    finally:
        tracemalloc.stop()
    held = 120 * 320 * 240 * 3 / 2**20        # the 120 extra frames, were they kept: 26 MiB
    assert long - short < 0.25 * held, (short, long)


def test_frames_from_any_iterator_come_back_restored_in_order(pipeline):
    frames = list(moving_frames(5, (320, 240)))
    out = list(enhance_frames(iter(frames), pipeline, fps=25))
    assert len(out) == 5 and all(o.shape == f.shape for o, f in zip(out, frames, strict=True))
    assert all(np.abs(o.astype(int) - f.astype(int)).max() > 20 for o, f in zip(out, frames, strict=True))


def test_a_frame_whose_detection_fails_passes_through_and_the_rest_follow():
    """A tracked (ordered) source whose detector fails on one frame: that frame comes back as it came in, every
    other frame is restored, in order, and the run ends (the ordered tracking step does not wait for the failed
    frame forever)."""
    from gpen_tune.face.detect import MTCNNDetector
    from gpen_tune.pipeline.scheduler import SchedulerConfig

    class FailsThirdCall(MTCNNDetector):
        calls = 0

        def detect(self, images):
            self.calls += 1
            if self.calls == 3:
                raise RuntimeError("the detector failed on this frame")
            return super().detect(images)

    model = load_model("synthetic", model=GPENConfig(64, narrow=0.25), device="cpu")
    frames = list(moving_frames(6, (320, 240)))
    with Pipeline(EnhanceSettings(device="cpu", detector="mtcnn", batch_size=4), model=model,
                  detector=FailsThirdCall("cpu")) as pipe:
        out: list[np.ndarray] = []
        run = threading.Thread(target=lambda: out.extend(enhance_frames(
            iter(frames), pipe, fps=25, config=SchedulerConfig(workers=1, prepare_workers=1))), daemon=True)
        run.start()
        run.join(timeout=180)                                       # a hang fails the test instead of the suite
        assert not run.is_alive(), "the run waits for the failed frame"
    assert len(out) == 6
    same = [np.array_equal(o, f) for o, f in zip(out, frames, strict=True)]
    assert same.count(True) == 1                                    # the failed frame, unchanged
    assert all(np.abs(o.astype(int) - f.astype(int)).max() > 20
               for o, f, s in zip(out, frames, same, strict=True) if not s)


# -- --video-preset: x264's speed preset, medium by default and veryfast under --preset speed --------------------

def test_the_preset_asked_for_else_veryfast_for_speed_else_medium():
    assert encoder_preset_for(None, None) == "medium"
    assert encoder_preset_for(None, "balanced") == "medium"
    assert encoder_preset_for(None, "speed") == "veryfast"
    assert encoder_preset_for("slow", "speed") == "slow"
    with pytest.raises(ValueError, match="ultrafast"):
        encoder_preset_for("quick", None)
    assert pick_encoder("h264", "mp4", preset="ultrafast")[1] == {"crf": "18", "preset": "ultrafast"} | x264_params()
    assert pick_encoder("hevc", "mkv", preset="fast")[1]["preset"] == "fast"
    assert "preset" not in pick_encoder("vp9", "webm", preset="fast")[1]          # only x264 / x265 take it
    assert ENCODER_PRESETS[0] == "ultrafast" and ENCODER_PRESETS[-1] == "veryslow"


def test_cli_writes_a_clip_with_the_fastest_preset_and_refuses_an_unknown_one(tmp_path):
    src = make_clip(tmp_path / "clip.mp4", n=6, size=(320, 240))
    res = invoke([str(src), "-o", str(tmp_path / "out"), "--video-preset", "ultrafast", *COMMON])
    assert res.exit_code == 0, res.output
    dst = tmp_path / "out" / "clip.mp4"
    with av.open(str(dst)) as c:
        stream = c.streams.video[0]
        assert stream.codec_context.name == "h264"
        frames = list(c.decode(video=0))
    assert len(frames) == 6
    assert packets(dst, "audio") == packets(src, "audio")
    bad = invoke([str(src), "-o", str(tmp_path / "bad"), "--video-preset", "quick", *COMMON])
    assert bad.exit_code != 0 and "--video-preset quick" in bad.output
    assert not (tmp_path / "bad" / "clip.mp4").exists()
