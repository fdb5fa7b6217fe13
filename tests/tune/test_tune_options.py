"""TuneConfig, presets and the `auto` decision from given free-memory values."""

from __future__ import annotations

import pytest

from gpen_tune.tune import PRESETS, TuneConfig, choose_preset
from gpen_tune.tune.options import with_overrides

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
    assert TuneConfig().enabled() == ["face_crop"] and TuneConfig().describe() == "face_crop"   # the default
    assert TuneConfig(face_crop=False).enabled() == []
    assert TuneConfig(face_crop=False).describe() == "all off (fp32 eager)"


def test_overrides_win_and_validation():
    cfg = with_overrides(PRESETS["speed"], compile="default", amp=None, act_checkpoint=True)
    assert cfg.compile == "default" and cfg.amp == "bf16" and cfg.act_checkpoint
    with pytest.raises(ValueError):
        TuneConfig(amp="fp8")
    with pytest.raises(ValueError):
        TuneConfig(compile="fast")


def test_cli_options_build_the_config_and_say_where_it_came_from():
    from gpen_tune.cli._options import tune_config_from_options

    cfg, line = tune_config_from_options("low-memory", compile="default", cuda_graph=True)
    assert cfg == with_overrides(PRESETS["low-memory"], compile="default", cuda_graph=True)
    assert line.startswith("preset low-memory") and "compile=default" in line

    cfg, line = tune_config_from_options("auto", device="cpu")
    assert cfg.fused and not cfg.cuda_graph and "preset cpu" in line

    cfg, _ = tune_config_from_options(None, amp="fp16")
    assert cfg == TuneConfig(face_crop=True, amp="fp16")  # no preset: all off but the enhance default face_crop
    cfg, _ = tune_config_from_options("speed", compile="off", face_crop=False)
    assert cfg.compile is None and cfg.face_crop is False and cfg.amp == "bf16"
    cfg, line = tune_config_from_options("none", act_checkpoint=True)
    assert cfg == TuneConfig(act_checkpoint=True) and line.startswith("no preset")   # none: every switch off


def test_tune_config_plugs_into_the_pipeline():
    """A TuneConfig through the Pipeline: one real photo restored with act_checkpoint, its LazyDetector built
    once and released before the generator ran."""
    import numpy as np
    from skimage import data

    from gpen_tune.face.detect import LazyDetector, init_detector
    from gpen_tune.load import load_model
    from gpen_tune.pipeline import EnhanceSettings, Pipeline, enhance_image

    model = load_model("synthetic", model="GPEN-BFR-256")
    cfg = TuneConfig(lazy_detector=True, act_checkpoint=True, face_crop=True)
    settings = EnhanceSettings(model="GPEN-BFR-256", weights="synthetic", detector="mtcnn", device="cpu")
    detector = LazyDetector(lambda: init_detector("mtcnn", device="cpu"), policy="always", device="cpu")
    with Pipeline(settings, cfg, model=model, detector=detector) as pipe:
        assert pipe.restorer.effective.act_checkpoint
        photo = data.astronaut()
        out = enhance_image(photo, pipeline=pipe)
    assert out.shape == photo.shape and not np.array_equal(out, photo)
    assert detector.builds == 1 and detector.releases == 1 and not detector.loaded  # released before the generator
