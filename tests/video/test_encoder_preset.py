"""--encoder-preset: x264's speed preset, medium by default and veryfast under --preset speed; a real clip through
the CLI with the fastest one still plays with its frames, timing and sound."""

from __future__ import annotations

import sys
from pathlib import Path

import av
import pytest
import typer
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))

from clips import make_clip, packets  # noqa: E402

from gpen_tune.cli import app  # noqa: E402
from gpen_tune.video.encoders import pick_encoder  # noqa: E402
from gpen_tune.video_presets import ENCODER_PRESETS, encoder_preset_for  # noqa: E402

COMMON = ["--weights", "synthetic", "--model", "GPEN-BFR-256", "--detector", "mtcnn", "--device", "cpu"]


def invoke(args: list[str]):
    command = typer.main.get_command(app)
    argv = (["enhance"] if hasattr(command, "commands") else []) + args
    return CliRunner().invoke(app, argv, catch_exceptions=False)


def test_the_preset_asked_for_else_veryfast_for_speed_else_medium():
    assert encoder_preset_for(None, None) == "medium"
    assert encoder_preset_for(None, "balanced") == "medium"
    assert encoder_preset_for(None, "speed") == "veryfast"
    assert encoder_preset_for("slow", "speed") == "slow"
    with pytest.raises(ValueError, match="ultrafast"):
        encoder_preset_for("quick", None)
    assert pick_encoder("h264", "mp4", preset="ultrafast")[1] == {"crf": "18", "preset": "ultrafast"}
    assert pick_encoder("hevc", "mkv", preset="fast")[1]["preset"] == "fast"
    assert "preset" not in pick_encoder("vp9", "webm", preset="fast")[1]          # only x264 / x265 take it
    assert ENCODER_PRESETS[0] == "ultrafast" and ENCODER_PRESETS[-1] == "veryslow"


def test_cli_writes_a_clip_with_the_fastest_preset_and_refuses_an_unknown_one(tmp_path):
    src = make_clip(tmp_path / "clip.mp4", n=6, size=(320, 240))
    res = invoke([str(src), "-o", str(tmp_path / "out"), "--encoder-preset", "ultrafast", *COMMON])
    assert res.exit_code == 0, res.output
    dst = tmp_path / "out" / "clip.mp4"
    with av.open(str(dst)) as c:
        stream = c.streams.video[0]
        assert stream.codec_context.name == "h264"
        frames = list(c.decode(video=0))
    assert len(frames) == 6
    assert packets(dst, "audio") == packets(src, "audio")
    bad = invoke([str(src), "-o", str(tmp_path / "bad"), "--encoder-preset", "quick", *COMMON])
    assert bad.exit_code != 0 and "--encoder-preset quick" in bad.output
    assert not (tmp_path / "bad" / "clip.mp4").exists()
