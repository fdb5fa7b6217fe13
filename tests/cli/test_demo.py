"""`gpen-tune demo` on the CPU: bundled real photos through enhance with --preset auto, per-stage table."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gpen_tune.cli import app
from gpen_tune.tune.hardware import cpu_capabilities


@pytest.mark.slow
def test_demo_runs_auto_preset_and_prints_the_stage_table(tmp_path):
    res = CliRunner().invoke(app, ["demo", "-o", str(tmp_path), "--model", "GPEN-BFR-256", "--weights", "synthetic",
                                   "--detector", "mtcnn", "--device", "cpu"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "preset cpu" in res.output           # auto explains its choice
    assert "per-stage timings" in res.output and "ms / face" in res.output
    report = json.loads((tmp_path / "report.json").read_text())
    # the cpu preset: bf16 where the CPU has native bf16 dot products, else fp32
    assert report["tune"]["requested"]["amp"] == ("bf16" if cpu_capabilities().bf16_dot else "off")
    assert report["tune"]["requested"]["fused"] and report["summary"]["faces"] >= 3
    assert report["summary"]["stages"]["restore"]["ms_per_face"] > 0
    assert {p.name for p in (tmp_path / "results").glob("*.png")} == {"astronaut.png", "grace_hopper.png",
                                                                       "mosaic.png"}
