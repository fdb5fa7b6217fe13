"""Every `gpen-tune enhance` flag runs end to end in some test: a census of the flags against the test sources,
and real runs for the flags no other test runs (each asserting what its flag changed). Small photos, GPEN-BFR-256
with synthetic weights, MTCNN, the CPU."""

from __future__ import annotations

import json
import re
from pathlib import Path

import av
import cv2
import numpy as np
import pytest
import typer
from PIL import Image
from typer.testing import CliRunner

from gpen_tune.cli import app
from gpen_tune.face import samples

TESTS = Path(__file__).resolve().parents[1]
COMMON = ["--weights", "synthetic", "--model", "GPEN-BFR-256", "--detector", "mtcnn", "--device", "cpu"]


def enhance(*args: str | Path):
    res = CliRunner().invoke(app, ["enhance", *map(str, args)])
    assert "Traceback" not in res.output, res.output
    return res


def face_photo(path: Path, size: int = 192) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(cv2.resize(samples.astronaut(), (size, size), interpolation=cv2.INTER_AREA)).save(path)
    return path


def wall(path: Path, shade: int = 90) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((48, 64, 3), shade, np.uint8)).save(path)
    return path


def enhance_flags() -> list[list[str]]:
    """Each option of `enhance` as its spellings (long, short, --no- form, hidden alias)."""
    command = typer.main.get_command(app).commands["enhance"]
    return [[*p.opts, *p.secondary_opts] for p in command.params if p.opts and p.opts[0].startswith("-")]


# Flags no test here can run, and why
NOT_RUN_HERE = {"--help": "not a run",
                "--ray-address": "joins a running Ray cluster, which a test machine has none of (--ray, a local "
                                 "Ray, runs in tests/distributed/test_cli_scale.py)"}


def test_every_enhance_flag_is_run_by_a_test():
    """A flag without a test (no test source passes it on a command line) fails here, by name."""
    sources = "\n".join(p.read_text() for p in TESTS.rglob("test_*.py"))
    untested = [spellings[0] for spellings in enhance_flags()
                if spellings[0] not in NOT_RUN_HERE
                and not any(re.search(rf"[\"']{re.escape(s)}[\"'=]", sources) for s in spellings)]
    assert untested == []


def test_inputs_by_option_recursive_strength_threshold_center_face_and_side_images(tmp_path):
    src = tmp_path / "in"
    face = face_photo(src / "sub" / "face.png")
    other = wall(tmp_path / "other.png")
    out, report = tmp_path / "out", tmp_path / "report.json"
    res = enhance(src, "--recursive", "-i", other, "--input", face, "-o", out, "-w", "0.5", "--det-threshold", "0.8",
                  "--only_center_face", "--no-parse-mask", "--save-mask", "--save-faces", "--save-comparison",
                  "--report", report, *COMMON)
    assert res.exit_code == 0, res.output
    assert (out / "sub" / "face.png").is_file() and (out / "other.png").is_file()   # the same file named twice: once
    settings = json.loads(report.read_text())["settings"]
    assert (settings["strength"], settings["det_threshold"], settings["only_center_face"]) == (0.5, 0.8, True)
    assert settings["parse_mask"] is False
    with Image.open(out / "masks" / "sub" / "face.png") as mask:                   # the paste's blend weights
        assert mask.mode == "L" and mask.size == (192, 192)
        values = np.asarray(mask)
    assert abs(int(values.max()) - 128) <= 1 and values.min() == 0   # -w 0.5: half the weight at most
    assert sorted(p.name for p in (out / "faces" / "sub").iterdir()) == ["face_face00.png"]
    with Image.open(out / "comparisons" / "sub" / "face.png") as cmp:
        assert cmp.size == (384, 192)
    with Image.open(face) as a, Image.open(out / "sub" / "face.png") as b:           # half strength: changed
        assert np.abs(np.asarray(a, np.int16) - np.asarray(b, np.int16)).max() > 0


@pytest.mark.slow
def test_background_upsampler_with_weights_scale_and_tiles(tmp_path):
    pytest.importorskip("spandrel")
    import sys

    sys.path.insert(0, str(TESTS / "background"))
    from test_background_upscale import rrdbnet_file

    photo = wall(tmp_path / "in" / "p.png")
    out = tmp_path / "out"
    res = enhance(photo, "-o", out, "--bg-upsampler", "realesrnet", "--bg-weights", rrdbnet_file(2, str(tmp_path)),
                  "--upscale", "2", "--tile", "32", *COMMON)
    assert res.exit_code == 0, res.output
    with Image.open(out / "p.png") as im:
        assert im.size == (128, 96)


def test_detector_weights_file(tmp_path):
    import sys

    sys.path.insert(0, str(TESTS / "face"))
    from test_face_detect import _retinaface_file

    weights = _retinaface_file(tmp_path)
    photo = wall(tmp_path / "in" / "p.png")
    out = tmp_path / "out"
    res = enhance(photo, "-o", out, "--weights", "synthetic", "--model", "GPEN-BFR-256", "--device", "cpu",
                  "--detector", "retinaface_mobile0.25", "--detector-weights", weights, "--report",
                  tmp_path / "r.json")
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["settings"]["detector_weights"] == str(weights) and (out / "p.png").is_file()


def test_video_codec_quality_and_smoothing_flags(tmp_path):
    clip = tmp_path / "clip.mp4"
    with av.open(str(clip), "w") as c:
        s = c.add_stream("mpeg4", rate=10)
        s.width, s.height, s.pix_fmt = 64, 48, "yuv420p"
        for i in range(4):
            for packet in s.encode(av.VideoFrame.from_ndarray(np.full((48, 64, 3), 40 + 30 * i, np.uint8),
                                                              format="rgb24")):
                c.mux(packet)
        for packet in s.encode(None):
            c.mux(packet)
    for smooth, codec in (("--no-smooth", "libx264"), ("--smooth", "libx265")):
        out = tmp_path / smooth
        res = enhance(clip, "-o", out, "--codec", codec, "--crf", "30", smooth, *COMMON)
        assert res.exit_code == 0, res.output
        with av.open(str(out / "clip.mp4")) as v:
            stream = v.streams.video[0]
            assert stream.codec_context.name == {"libx264": "h264", "libx265": "hevc"}[codec]
            assert sum(1 for _ in v.decode(stream)) == 4
