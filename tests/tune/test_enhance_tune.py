"""`gpen-tune enhance` with the optimization switches, end to end on CPU (GPEN-BFR-256, synthetic weights).

Outputs of each switch must stay within the tolerance TuneConfig states for it, measured against the plain run
(no switch), and the JSON report must record the TuneConfig and every fallback/skip.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import typer
from PIL import Image
from typer.testing import CliRunner

from gpen_tune.cli import app
from gpen_tune.face import samples
from gpen_tune.tune.hardware import cpu_capabilities

MODEL = "GPEN-BFR-256"


def invoke(args: list[str]):
    command = typer.main.get_command(app)
    argv = (["enhance"] if hasattr(command, "commands") else []) + args
    return CliRunner().invoke(app, argv, catch_exceptions=False)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("tune_in")
    Image.fromarray(samples.astronaut()).save(root / "astronaut.png")
    Image.fromarray(samples.grace_hopper()).save(root / "hopper.png")
    return root


def run(folder, out, *flags):
    report = out.parent / f"{out.name}.json"
    res = invoke([str(folder), "-o", str(out), "--weights", "synthetic", "--model", MODEL, "--detector", "mtcnn",
                  "--device", "cpu", "--batch-size", "2", "--save-faces", "--report", str(report), *flags])
    assert res.exit_code == 0, res.output
    return res, json.loads(report.read_text())


def faces(out) -> list[np.ndarray]:
    """The restored aligned crops (the generator's own output, before paste-back): right half of crop | restored."""
    files = sorted((out / "faces").glob("*_face*"))
    pairs = [np.asarray(Image.open(p).convert("RGB"), dtype=np.float64) for p in files]
    return [x[:, x.shape[1] // 2:] for x in pairs]


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a - b) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


@pytest.fixture(scope="module")
def plain(folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("plain") / "out"
    res, report = run(folder, out, "--preset", "none")
    return out, res, report


def outputs(out) -> list[np.ndarray]:
    return [np.asarray(Image.open(p).convert("RGB"), dtype=np.float64) for p in sorted(out.glob("*.png"))]


def test_plain_run_records_config_and_prints_stage_table(plain):
    out, res, report = plain
    assert report["tune"]["requested"]["face_crop"] is True          # preset none: face_crop on, rest off
    assert report["tune"]["requested"]["amp"] == "off" and report["tune"]["fallbacks"] == []
    assert "no preset" in res.output and "per-stage timings" in res.output and "ms / face" in res.output
    stages = report["summary"]["stages"]
    assert set(stages) >= {"decode", "detect", "restore", "paste"} and stages["restore"]["ms_per_face"] > 0
    assert report["summary"]["faces"] >= 2 and len(outputs(out)) == 2


@pytest.mark.parametrize("flags, min_psnr, max_abs", [
    ([], 40.0, None),                                # the default, preset auto: on the CPU the cpu preset (bf16 where
                                                     # native), and it says so
    (["--preset", "none", "--act-checkpoint"], None, 0.0),   # act_checkpoint: identical output
    (["--preset", "none", "--checkpoint"], None, 0.0),       # its earlier name, a hidden alias: the same
    (["--preset", "none", "--fused", "--onednn"], None, 1.0),  # the fused generator's oneDNN form in fp32
    # bf16 + checkpoint (+ GPU-only switches skipped on CPU): amp's >= 40 dB PSNR vs fp32, on the pipelined runner
    # (2 inputs in one batch); the serial path runs the same restorer (its bf16 batches: tests/pipeline/test_enhance)
    pytest.param(["--preset", "low-memory"], 40.0, None, marks=pytest.mark.cpu_bf16),
])
def test_switch_outputs_within_tolerance_of_plain_run(folder, tmp_path, plain, flags, min_psnr, max_abs):
    out = tmp_path / "out"
    res, report = run(folder, out, *flags)
    ref_faces, got_faces = faces(plain[0]), faces(out)
    assert len(got_faces) == len(ref_faces) >= 2
    # auto picks bf16 only where the CPU has native bf16 dot products, else the fused generator in fp32
    auto_bf16 = cpu_capabilities().bf16_dot
    auto = "--preset" not in flags
    for a, b in zip(ref_faces, got_faces, strict=True):
        if min_psnr is not None and (not auto or auto_bf16):
            assert min_psnr <= psnr(a, b) < float("inf")   # bf16 ran (not identical) and stayed close
        elif min_psnr is not None:
            assert psnr(a, b) >= 60.0                       # fp32 fused: the plain run's pixels to rounding
        if max_abs is not None:
            assert np.abs(a - b).max() <= max_abs
    for a, b in zip(outputs(plain[0]), outputs(out), strict=True):
        assert psnr(a, b) >= (min_psnr or 60.0)
    tune = report["tune"]
    if auto:
        assert "preset cpu" in res.output and tune["effective"]["fused"]
        assert tune["effective"]["onednn"] == auto_bf16    # the oneDNN form with bf16 only (fp32: not faster)
        assert tune["effective"]["amp"] == ("bf16" if auto_bf16 else "off")
        assert not tune["effective"]["cuda_graph"]       # the cpu preset asks for no GPU-only switch
    if "--onednn" in flags:
        assert tune["effective"]["onednn"] and tune["effective"]["fused"] and not tune["skipped"]
    elif "none" in flags:
        assert tune["requested"]["act_checkpoint"] is True and tune["effective"]["act_checkpoint"] is True
    if "low-memory" in flags:
        assert "preset low-memory" in res.output
        assert tune["requested"]["act_checkpoint"] is True and tune["requested"]["amp"] == "bf16"
        assert tune["effective"]["amp"] == "bf16" and tune["effective"]["act_checkpoint"] is True
        # switches that need CUDA are skipped on the CPU: the skip is a recorded fallback, not silence
        for name, reason in tune["skipped"].items():
            assert any(name in msg for msg in tune["fallbacks"]) and reason


def test_help_lists_the_optimizations_panel():
    res = invoke(["--help"])
    assert res.exit_code == 0
    assert "Optimizations" in res.output
    assert "auto (default)" in res.output
    for flag in ("--preset", "--amp", "--compile", "--act-checkpoint", "--cuda-graph", "--fused", "--lazy-detector",
                 "--face-crop"):
        assert flag in res.output


def test_compiled_restorer_sees_one_batch_shape_in_the_runner(folder, tmp_path):
    """With --compile the runner pads every batch to --batch-size (one compile, one capture); without, buckets."""
    import torch

    from gpen_tune.load import load_model
    from gpen_tune.model.configs import GPENConfig
    from gpen_tune.pipeline import EnhanceSettings, Pipeline, SchedulerConfig, enhance
    from gpen_tune.restore.restorer import Restorer
    from gpen_tune.tune import TuneConfig

    model = load_model("synthetic", model=GPENConfig(64, narrow=0.25), device="cpu")
    files = sorted(folder.glob("*.png"))
    seen: dict[str, list[int]] = {}
    for name, cfg in (("compiled", TuneConfig(compile="default")), ("eager", TuneConfig())):
        shapes = seen.setdefault(name, [])

        def spy(x: torch.Tensor, shapes=shapes) -> torch.Tensor:
            shapes.append(x.shape[0])
            return model(x)

        restore = Restorer(spy, model=model, cfg=cfg, device="cpu", size=64, max_batch=4,
                           one_shape=bool(cfg.compile))                        # as build_restorer makes it
        settings = EnhanceSettings(device="cpu", detector="mtcnn", batch_size=4)
        with Pipeline(settings, cfg, restorer=restore) as pipe:
            jobs = enhance(files, tmp_path / name, pipeline=pipe, serial=False,
                           config=SchedulerConfig(workers=1)).summary.results
        assert [j.status for j in jobs] == ["ok", "ok"]
    assert seen["compiled"] and set(seen["compiled"]) == {4}
    assert set(seen["eager"]) <= {1, 2} and sum(seen["eager"]) == 2  # the two faces, no padding
