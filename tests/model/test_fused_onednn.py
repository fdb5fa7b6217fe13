"""The fused generator's oneDNN form (`--fused --onednn`, the CPU preset) computes the plain model's function.

Tolerances as the fused generator's: fp32 max-abs <= 1e-4 against FullGenerator (observed ~5e-6), bf16 >= 40 dB
PSNR (observed ~51 dB on GPEN-BFR-256). Inputs are real photo crops (skimage's astronaut).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from test_fast import FP32_TOL, TINY, faces, psnr

from gpen_tune.bench.rows import select_rows
from gpen_tune.face import samples
from gpen_tune.load import load_model
from gpen_tune.model.fused_onednn import OnednnGenerator, available, fuse_onednn, interleave, phase_weight
from gpen_tune.restore import build_restorer
from gpen_tune.tune import onednn
from gpen_tune.tune.options import PRESETS, TuneConfig

pytestmark = pytest.mark.skipif(available() is not None, reason=f"{available()}")


@pytest.fixture(scope="module")
def tiny64():
    return load_model("synthetic", model=TINY[64])


def test_phase_conv_is_the_transposed_conv():
    """conv_transpose2d(x, w, stride 2) == the 2x2 phase conv interleaved, on its whole (2H+1)^2 output."""
    torch.manual_seed(0)
    x = torch.randn(2, 5, 6, 7, dtype=torch.float64)
    w = torch.randn(5, 3, 3, 3, dtype=torch.float64)
    want = F.conv_transpose2d(x, w, stride=2)
    y = F.conv2d(x, phase_weight(w), padding=1)
    got = interleave(y, 3)
    assert got.shape[-2:] == (14, 16)
    assert float((got[:, :, :13, :15] - want).abs().max()) < 1e-12
    assert float(got[:, :, 13:].abs().max()) == 0.0 and float(got[:, :, :, 15:].abs().max()) == 0.0


@pytest.mark.parametrize("size", [32, 64])
def test_fp32_is_the_model_function(size):
    model = load_model("synthetic", model=TINY[size])
    x = faces(size, 2)
    gen = fuse_onednn(model, torch.float32)
    with torch.no_grad():
        want = model(x)
        got = gen(x)
    assert got.shape == want.shape and got.dtype == torch.float32
    assert float((got - want).abs().max()) <= FP32_TOL


def test_both_modulation_sides_and_batches_loop(tiny64):
    """The style scales the weight in the 64 px layer (smaller than its input) and the input elsewhere; a batch
    runs face by face with the same result as single calls."""
    gen = fuse_onednn(tiny64, torch.float32)
    assert {layer.modulate_weight for layer in gen.layers} == {True, False}
    x = faces(64, 3)
    with torch.no_grad():
        full = gen(x)
        one = torch.cat([gen(x[i:i + 1]) for i in range(3)])
    assert float((full - one).abs().max()) == 0.0


def test_bf16_holds_40db(tiny64):
    x = faces(64, 2)
    with torch.no_grad():
        want = tiny64(x)
        got = fuse_onednn(tiny64, torch.bfloat16)(x)
    assert got.dtype == torch.float32 and bool(torch.isfinite(got).all())
    assert psnr(got, want) >= 40.0


def test_zero_style_channel_stays_exact():
    """A style exactly 0 zeroes its input channel (weights or input scaled by it); nothing divides by a style."""
    model = load_model("synthetic", model=TINY[32])
    mod = model.generator.convs[2].conv.modulation
    with torch.no_grad():
        mod.weight[:3] = 0
        mod.bias[:3] = 0
    x = faces(32, 2)
    with torch.no_grad():
        want = model(x)
        got = fuse_onednn(model, torch.float32)(x)
    assert float((got - want).abs().max()) <= FP32_TOL


def test_switch_rules():
    assert onednn.is_supported("cpu", TuneConfig(fused=True, onednn=True)) is None
    assert "CPU" in onednn.is_supported("cuda", TuneConfig(fused=True, onednn=True))
    assert "--fused" in onednn.is_supported("cpu", TuneConfig(onednn=True))
    assert PRESETS["cpu"].onednn and PRESETS["cpu"].fused
    row = select_rows(["onednn"])[0]
    assert row.label == "--fused --onednn" and row.cfg.onednn and row.cfg.fused


def test_cpu_preset_restores_real_faces_with_the_onednn_form(tiny64):
    """The cpu preset's restorer runs the oneDNN form on the bundled photos' aligned faces, >= 40 dB vs fp32; without
    --fused the switch is skipped with its reason and the plain model runs."""
    crops = samples.aligned_face_crops(64, n=2)
    x = torch.from_numpy(crops).permute(0, 3, 1, 2).float() / 127.5 - 1
    with torch.no_grad():
        ref = tiny64(x)
    restorer = build_restorer(copy.deepcopy(tiny64), PRESETS["cpu"], device="cpu", max_batch=1)
    assert isinstance(restorer.forward, OnednnGenerator)
    assert restorer.effective.onednn and not restorer.skipped
    assert psnr(restorer(x), ref) >= 40.0
    out = restorer.restore_crops(list(crops))
    assert out.shape == crops.shape and out.dtype == crops.dtype
    alone = build_restorer(copy.deepcopy(tiny64), TuneConfig(onednn=True), device="cpu", max_batch=1)
    assert "fused" in alone.skipped["onednn"] and not alone.effective.onednn
