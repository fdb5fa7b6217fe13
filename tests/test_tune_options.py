"""TuneConfig, presets and the `auto` decision from given free-memory values."""

from __future__ import annotations

import pytest

from gpen_tune.tune import PRESETS, TuneConfig, choose_preset
from gpen_tune.tune.options import STEPS, switch_help, with_overrides

GiB = 1024**3


@pytest.mark.parametrize(
    ("free", "total", "name"),
    [(None, None, "balanced"), (120 * GiB, 140 * GiB, "speed"), (16 * GiB, 24 * GiB, "speed"),
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
    assert PRESETS["speed"].compile and PRESETS["speed"].amp == "bf16" and PRESETS["speed"].cuda_graph
    low = PRESETS["low-memory"]
    assert low.act_checkpoint and low.lazy_detector and not low.cuda_graph and low.compile is None
    assert TuneConfig().enabled() == []
    assert TuneConfig().describe() == "all off (fp32 eager)"


def test_overrides_win_and_validation():
    cfg = with_overrides(PRESETS["speed"], compile="off", amp=None, act_checkpoint=True)
    assert cfg.compile is None and cfg.amp == "bf16" and cfg.act_checkpoint
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
