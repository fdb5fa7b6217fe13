"""The CLI's flags against the library: every TuneConfig switch has its flag in `enhance` and `bench` (help from
the field's metadata), and `--det-size` reaches the detector whatever `--face-crop` says."""

from __future__ import annotations

import inspect
import json
from dataclasses import fields

import cv2
import pytest
import typer
from PIL import Image
from typer.testing import CliRunner

from gpen_tune.cli import app
from gpen_tune.cli._options import tune_config_from_options
from gpen_tune.face import samples
from gpen_tune.pipeline.settings import DEFAULT_DET_SIZE, detection_size
from gpen_tune.tune import TuneConfig
from gpen_tune.tune.options import switch_meta, switch_short

NON_DEFAULT = {"compile": "default", "amp": "bf16", "backend": "onnxruntime"}  # the switches that are not booleans
HIDDEN_ALIASES = {"--checkpoint": "act_checkpoint"}              # earlier flag names that keep working


def _flag(field: str) -> str:
    """Every switch has one name: the field's, as flag, config and docs."""
    return "--" + field.replace("_", "-")


@pytest.mark.parametrize("command", ["enhance", "bench"])
def test_every_tune_field_has_its_flag_with_the_fields_help(command):
    params = typer.main.get_command(app).commands[command].params
    opts = {o for p in params for o in (*p.opts, *getattr(p, "secondary_opts", []))}
    helps = {p.help for p in params if getattr(p, "help", None)}
    for field in fields(TuneConfig):
        assert _flag(field.name) in opts, f"{command}: no flag for TuneConfig.{field.name}"
        assert switch_short(field.name) in helps, f"{command}: {_flag(field.name)} lacks the field's help"
    for alias in HIDDEN_ALIASES:                                 # kept for users' scripts, not in --help
        param = next(p for p in params if alias in p.opts)
        assert param.hidden and alias not in CliRunner().invoke(app, [command, "--help"]).output


@pytest.mark.parametrize("command", ["enhance", "bench"])
def test_help_fits_a_screenful_with_short_option_texts(command):
    """At 120 columns the help stays under 100 lines; option texts say what a flag does, without measured figures."""
    res = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "120"}, terminal_width=120)
    assert res.exit_code == 0 and "Usage:" in res.output
    lines = res.output.splitlines()
    assert len(lines) <= 100, f"{command} --help is {len(lines)} lines at 120 columns"
    assert max(len(line) for line in lines) <= 120
    params = typer.main.get_command(app).commands[command].params
    for p in params:
        text = getattr(p, "help", None) or ""
        assert len(text) <= 130, f"{command} {p.opts[0]}: help is {len(text)} characters"
        assert "faces/s" not in text and " ms" not in text, f"{command} {p.opts[0]}: a figure in the help"


def test_each_switch_flag_sets_exactly_its_field():
    """The flags' builder takes one argument per TuneConfig field, and each sets that field and no other."""
    names = {f.name for f in fields(TuneConfig)}
    args = set(inspect.signature(tune_config_from_options).parameters) - {"preset", "device", "base"}
    assert args == names
    base = TuneConfig(face_crop=False)
    for field in fields(TuneConfig):
        arg = field.name
        assert switch_meta(arg)["flag"] == _flag(arg)
        value = NON_DEFAULT.get(field.name, not getattr(base, field.name))
        cfg, _ = tune_config_from_options(None, base=base, **{arg: value})
        changed = {f.name for f in fields(TuneConfig) if getattr(cfg, f.name) != getattr(base, f.name)}
        assert changed == {field.name}, arg


def test_detection_size_follows_face_crop_unless_given():
    assert detection_size(None, True) == DEFAULT_DET_SIZE and detection_size(None, False) is None
    assert detection_size(512, False) == detection_size(512, True) == 512
    assert detection_size(0, True) is None                                  # 0 = native size


@pytest.mark.slow
def test_no_face_crop_with_det_size_detects_at_that_size(tmp_path):
    """`--no-face-crop --det-size 512`: the detector gets 512 (not the native size the comparison mode defaults to),
    as the report's settings and the built detector say; without --det-size it detects at the native size."""
    photo = tmp_path / "in.png"
    Image.fromarray(cv2.resize(samples.astronaut(), (320, 320), interpolation=cv2.INTER_AREA)).save(photo)
    common = ["enhance", str(photo), "--no-face-crop", "--model", "GPEN-BFR-256", "--weights", "synthetic",
              "--detector", "mtcnn", "--device", "cpu"]
    got = {}
    for name, extra in (("given", ["--det-size", "512"]), ("native", [])):
        report = tmp_path / f"{name}.json"
        res = CliRunner().invoke(app, [*common, "-o", str(tmp_path / name), "--report", str(report), *extra],
                                 catch_exceptions=False)
        assert res.exit_code == 0, res.output
        got[name] = json.loads(report.read_text())
    assert got["given"]["settings"]["det_size"] == 512 and got["native"]["settings"]["det_size"] is None
    assert got["given"]["tune"]["requested"]["face_crop"] is False
    assert got["given"]["summary"]["faces"] == got["native"]["summary"]["faces"] == 1


def test_the_pipeline_builds_its_detector_at_the_settings_size():
    from gpen_tune.load import load_model
    from gpen_tune.model.configs import GPENConfig
    from gpen_tune.pipeline import EnhanceSettings, Pipeline

    model = load_model("synthetic", model=GPENConfig(64, narrow=0.25))
    settings = EnhanceSettings(device="cpu", detector="mtcnn", det_size=detection_size(512, face_crop=False))
    with Pipeline(settings, TuneConfig(face_crop=False), model=model) as pipe:
        assert pipe.detector("inline").det_size == 512
