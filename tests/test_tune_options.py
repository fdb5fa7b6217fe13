"""TuneConfig, presets and the `auto` decision from given free-memory values."""

from __future__ import annotations

import pytest

from gpen_tune.tune import PRESETS, TuneConfig, choose_preset
from gpen_tune.tune.options import STEPS, switch_help, with_overrides

GiB = 1024**3


@pytest.mark.parametrize(
    ("free", "total", "name"),
    [(120 * GiB, 140 * GiB, "speed"), (16 * GiB, 24 * GiB, "speed"),
     (10 * GiB, 24 * GiB, "balanced"), (6 * GiB, 8 * GiB, "balanced"), (5 * GiB, 8 * GiB, "low-memory"),
     (512 * 1024**2, 8 * GiB, "low-memory")],
)
def test_auto_chooses_from_free_memory(free, total, name):
    chosen, cfg, reason = choose_preset(free, total)
    assert chosen == name and cfg == PRESETS[name]
    assert name in reason
    if free is not None:
        assert f"{free / GiB:.1f} GiB free" in reason


def test_presets_are_what_they_say():
    speed = PRESETS["speed"]
    assert speed.fused and speed.amp == "bf16" and speed.cuda_graph and speed.compile is None
    low = PRESETS["low-memory"]
    assert low.act_checkpoint and low.lazy_detector and not low.cuda_graph and low.compile is None
    assert TuneConfig().enabled() == []
    assert TuneConfig().describe() == "all off (fp32 eager)"


def test_overrides_win_and_validation():
    cfg = with_overrides(PRESETS["speed"], compile="default", amp=None, act_checkpoint=True)
    assert cfg.compile == "default" and cfg.amp == "bf16" and cfg.act_checkpoint
    with pytest.raises(ValueError):
        TuneConfig(amp="fp8")
    with pytest.raises(ValueError):
        TuneConfig(compile="fast")


def test_every_step_has_help_and_tolerance():
    assert STEPS == ("lazy_detector", "compile", "amp", "act_checkpoint", "face_crop", "cuda_graph")
    for name in (*STEPS, "fused"):
        text = switch_help(name)
        assert "tolerance:" in text and len(text) > 60
    assert "no_grad" in switch_help("act_checkpoint")


def test_cli_options_build_the_config_and_say_where_it_came_from():
    from gpen_tune.cli._options import AmpMode, CompileMode, Preset, tune_config_from_options

    cfg, line = tune_config_from_options(Preset.low_memory, compile=CompileMode.default, cuda_graph=True)
    assert cfg == with_overrides(PRESETS["low-memory"], compile="default", cuda_graph=True)
    assert line.startswith("preset low-memory") and "compile=default" in line

    cfg, line = tune_config_from_options(Preset.auto, device="cpu")
    assert cfg.fused and not cfg.cuda_graph and "preset cpu" in line

    cfg, _ = tune_config_from_options(None, amp=AmpMode.fp16)
    assert cfg == TuneConfig(face_crop=True, amp="fp16")  # no preset: all off but the enhance default face_crop
    cfg, _ = tune_config_from_options(Preset.speed, compile=CompileMode.off, face_crop=False)
    assert cfg.compile is None and cfg.face_crop is False and cfg.amp == "bf16"


def test_tune_pipeline_plugs_into_the_enhancer():
    """With the pipeline part merged: enhance one real photo through the Restorer and a LazyDetector."""
    pipeline = pytest.importorskip("gpen_tune.face.pipeline", reason="needs the pipeline part (gpen_tune.face)")
    import numpy as np
    from gpen_tune.restore.wiring import tune_pipeline
    from skimage import data

    from gpen_tune.load import load_model

    model = load_model("synthetic", model="GPEN-BFR-256")
    cfg = TuneConfig(lazy_detector=True, act_checkpoint=True, face_crop=True)
    settings = pipeline.EnhanceSettings(model="GPEN-BFR-256", weights="synthetic", detector="mtcnn", device="cpu",
                                        face_crop=False, det_size=None)
    settings, restore, detector = tune_pipeline(settings, cfg, model, "cpu", detector_policy="always")
    assert settings.face_crop is True and settings.det_size == 1024
    enhancer = pipeline.Enhancer(settings, model=restore.model, restore=restore, detector=detector)
    photo = data.astronaut()
    out = pipeline.enhance_image(photo, enhancer=enhancer)
    assert out.shape == photo.shape and not np.array_equal(out, photo)
    assert detector.builds == 1 and detector.releases == 1 and not detector.loaded  # released before the generator
