"""The fast path computes the plain model's function: every fused pass against the fp32 formulation.

Tolerances: fp32 paths max-abs <= 1e-4 against FullGenerator / the per-sample reference (observed ~5e-6);
bf16 >= 40 dB PSNR (the fidelity bar; observed ~50 dB). Triton kernels run through Triton's CPU
interpreter in a subprocess (TRITON_INTERPRET=1 must be set before Triton is imported).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from gpen_tune.load import load_model
from gpen_tune.model import GPENConfig
from gpen_tune.model.fused import fuse
from gpen_tune.model.reference import reference_forward
from gpen_tune.ops import modconv_epilogue as E
from gpen_tune.ops.fir import fused_leaky_relu, make_kernel, upfirdn2d

ROOT = Path(__file__).resolve().parents[2]
FP32_TOL = 1e-4
TINY = {32: GPENConfig(32, narrow=0.25), 64: GPENConfig(64, narrow=0.25)}


def faces(size: int, n: int) -> torch.Tensor:
    """Real photo crops in [-1, 1]: the astronaut's face and three shifted / mirrored windows around it."""
    from skimage import data

    img = torch.from_numpy(data.astronaut()).permute(2, 0, 1).float()[None] / 127.5 - 1.0
    crops = []
    for i in range(n):
        y0, x0 = 20 + 12 * i, 110 + 10 * i
        c = img[:, :, y0:y0 + 240, x0:x0 + 240]
        if i % 2:
            c = c.flip(3)
        crops.append(F.interpolate(c, size=(size, size), mode="bilinear", antialias=True, align_corners=False))
    return torch.cat(crops).clamp(-1, 1)


@pytest.fixture(scope="module")
def tiny_models():
    return {s: load_model("synthetic", model=cfg) for s, cfg in TINY.items()}


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = float((a.clamp(-1, 1) - b.clamp(-1, 1)).square().mean())
    return 10 * math.log10(4.0 / mse)


# ---------------------------------------------------------------------------------------------------------------
# whole model, fp32


@pytest.mark.parametrize("size", [32, 64])
def test_fused_fp32_matches_model(tiny_models, size):
    model = tiny_models[size]
    x = faces(size, 3)
    with torch.no_grad():
        want = model(x)
        got = fuse(model, impl="torch")(x)
    assert got.shape == want.shape and got.dtype == torch.float32
    assert float((got - want).abs().max()) <= FP32_TOL


def test_reference_matches_model_and_upstream_formulas(tiny_models):
    from gpen_reference import gpen_forward_ref  # the independent state-dict reference (tests/)

    model = tiny_models[32]
    x = faces(32, 2)
    with torch.no_grad():
        ref = reference_forward(model, x)
        assert float((ref - model(x)).abs().max()) <= FP32_TOL
        sd = {k: v.float() for k, v in model.state_dict().items()}
        assert float((ref - gpen_forward_ref(sd, x)).abs().max()) <= FP32_TOL
        assert float((fuse(model)(x) - ref).abs().max()) <= FP32_TOL


def test_fused_gpen256_matches_reference():
    model = load_model("synthetic", model="GPEN-BFR-256")
    x = faces(256, 1)
    with torch.no_grad():
        ref = reference_forward(model, x)
        got = fuse(model)(x)
    assert float((got - ref).abs().max()) <= FP32_TOL


def test_batch_rows_are_independent(tiny_models):
    """Per-sample styles/demodulation: a face's output does not depend on its batch neighbours."""
    model = tiny_models[32]
    x = faces(32, 4)
    fast = fuse(model)
    with torch.no_grad():
        full = fast(x)
        one = torch.cat([fast(x[i:i + 1]) for i in range(4)])
    assert float((full - one).abs().max()) <= FP32_TOL


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_fused_holds_40db(tiny_models, dtype):
    model = tiny_models[64]
    x = faces(64, 2)
    with torch.no_grad():
        want = model(x)
        got = fuse(model, dtype)(x)
    assert got.dtype == torch.float32 and bool(torch.isfinite(got).all())
    assert psnr(got, want) >= 40.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_zero_style_channel_stays_finite_and_exact(dtype):
    """A style exactly 0 on a channel the buffer is pre-scaled by: ToRGB's s_rgb / s_next must not blow up."""
    model = load_model("synthetic", model=TINY[32])
    mod = model.generator.convs[2].conv.modulation     # the style that scales the buffer ToRGB 8 px reads
    with torch.no_grad():
        mod.weight[:3] = 0
        mod.bias[:3] = 0
    x = faces(32, 2)
    with torch.no_grad():
        want = model(x)
        got = fuse(model, dtype)(x)
    assert bool(torch.isfinite(got).all())
    if dtype == torch.float32:
        assert float((got - want).abs().max()) <= FP32_TOL
    else:
        assert psnr(got, want) >= 40.0


def test_impl_is_checked(tiny_models):
    with pytest.raises(ValueError, match="impl"):
        fuse(tiny_models[32], impl="nope")
    with pytest.raises(RuntimeError, match="triton"):
        fast = fuse(tiny_models[32], impl="triton")
        if os.environ.get("TRITON_INTERPRET") == "1":
            pytest.skip("interpreter makes Triton available on CPU")
        fast(faces(32, 1))


def test_fuse_keeps_the_source_model_untouched(tiny_models):
    model = tiny_models[32]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fuse(model, torch.bfloat16)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_fused_module_shares_no_storage_with_the_source():
    """The tune part casts the source model to half after fuse() (NaN-fallback template): no aliasing allowed."""
    from gpen_tune.tune.amp import cast_model

    model = load_model("synthetic", model=TINY[32])
    x = faces(32, 1)
    fast = fuse(model)
    with torch.no_grad():
        before = fast(x)
        cast_model(model, torch.bfloat16)
        after = fast(x)
    assert torch.equal(before, after)


# ---------------------------------------------------------------------------------------------------------------
# the fused passes against their unfused formulation


def _vec(*shape):
    return torch.randn(*shape, dtype=torch.float32)


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("upsampled", [False, True])
def test_styled_epilogue_equals_unfused(channels_last, upsampled):
    torch.manual_seed(1)
    b, c, h = 2, 6, 9
    y = torch.randn(b, c, 2 * h + 1 if upsampled else h, 2 * h + 1 if upsampled else h)
    hh = 2 * h if upsampled else h
    f = torch.randn(b, c, hh, hh)
    d, s = _vec(b, c).abs() + 0.1, _vec(b, 2 * c)
    bias = _vec(2 * c)
    nw = 0.37
    kernel = make_kernel((1, 3, 3, 1)) * 4
    if channels_last:
        y, f = y.contiguous(memory_format=torch.channels_last), f.contiguous(memory_format=torch.channels_last)
    # unfused: FIR (upfirdn2d), demodulate, concat the scaled feature, bias + lrelu, next layer's style
    yy = upfirdn2d(y, kernel, pad=(1, 1)) if upsampled else y
    want = fused_leaky_relu(torch.cat([yy * d[:, :, None, None], f * nw], 1), bias) * s[:, :, None, None]
    taps = E.separable_taps(kernel) if upsampled else None
    got = E.styled_epilogue(y, f, d, bias[:c], s[:, :c], bias[c:], s[:, c:], nw, taps)
    assert got.shape == want.shape
    assert float((got - want).abs().max()) <= 1e-5
    assert got.is_contiguous(memory_format=torch.channels_last) == channels_last


def test_encoder_epilogue_equals_unfused():
    torch.manual_seed(2)
    z = torch.randn(2, 5, 8, 8)
    bias = _vec(5)
    kernel = make_kernel((1, 3, 3, 1))
    f, fb = E.encoder_epilogue(z, bias, E.separable_taps(kernel))
    want_f = fused_leaky_relu(z, bias)
    assert float((f - want_f).abs().max()) <= 1e-6
    assert float((fb - upfirdn2d(want_f, kernel, pad=(2, 2))).abs().max()) <= 1e-5


def test_safe_style_floor_keeps_sign_and_value():
    s = torch.tensor([[0.0, 1e-30, -1e-30, 0.5, -2.0]])
    assert torch.equal(E.safe_style(s), torch.tensor([[1e-20, 1e-20, -1e-20, 0.5, -2.0]]))
    rel = E.safe_style(s, rel=0.25)                          # floor 0.25 * 2.0 = 0.5
    assert torch.equal(rel, torch.tensor([[0.5, 0.5, -0.5, 0.5, -2.0]]))


# ---------------------------------------------------------------------------------------------------------------
# Triton kernels (CPU interpreter)

_TRITON_SCRIPT = textwrap.dedent("""
    import json, torch
    from gpen_tune.model.fused import fuse
    from gpen_tune.ops import modconv_epilogue as E, modconv_epilogue_triton as T
    from gpen_tune.model import GPENConfig
    from gpen_tune.load import load_model
    from gpen_tune.ops.fir import make_kernel
    torch.manual_seed(0)
    cl = torch.channels_last
    res = {}
    kernel = make_kernel((1, 3, 3, 1)) * 4
    taps = E.separable_taps(kernel)
    taps2d = (torch.tensor(taps[0])[:, None] * torch.tensor(taps[1])[None, :]).float()
    b, c, h = 2, 70, 7                   # C not a multiple of the channel block, H not of the tile
    for up in (False, True):
        hy = 2 * h + 1 if up else h
        ho = 2 * h if up else h
        y = torch.randn(b, c, hy, hy).contiguous(memory_format=cl)
        f = torch.randn(b, c, ho, ho).contiguous(memory_format=cl)
        d, s, bias = torch.rand(b, c) + 0.1, torch.randn(b, 2 * c), torch.randn(2 * c)
        args = (y, f, d, bias[:c], s[:, :c], bias[c:], s[:, c:], 0.3)
        want = E.styled_epilogue(*args, taps if up else None)
        got = T.styled_epilogue(*args, taps2d if up else None)
        res[f"styled_up{int(up)}"] = float((got - want).abs().max())
        gb = T.styled_epilogue(y.bfloat16(), f.bfloat16(), *args[2:], taps2d if up else None)
        res[f"styled_up{int(up)}_bf16_rel"] = float((gb.float() - want).abs().max() / want.abs().max())
    z = torch.randn(b, c, 10, 10).contiguous(memory_format=cl)
    bias = torch.randn(c)
    ktaps = E.separable_taps(make_kernel((1, 3, 3, 1)))
    k2 = (torch.tensor(ktaps[0])[:, None] * torch.tensor(ktaps[1])[None, :]).float()
    wf, wfb = E.encoder_epilogue(z, bias, ktaps)
    gf, gfb = T.encoder_epilogue(z, bias, k2)
    res["enc_f"] = float((gf - wf).abs().max())
    res["enc_fb"] = float((gfb - wfb).abs().max())
    gf2, none = T.encoder_epilogue(z, bias, None)
    res["enc_noblur"] = float((gf2 - wf).abs().max()) + (0.0 if none is None else 1.0)
    zo = torch.randn(3, 37, 9, 13).contiguous(memory_format=cl)      # odd H, W, C; 2 x 1 tiles
    bo = torch.randn(37)
    of, ofb = E.encoder_epilogue(zo, bo, ktaps)
    vf, vfb = T.encoder_epilogue(zo, bo, k2)
    res["enc_odd_v2"] = max(float((vf - of).abs().max()), float((vfb - ofb).abs().max()))
    hf, hfb = T.encoder_epilogue(zo.bfloat16(), bo, k2)
    rf, rfb = E.encoder_epilogue(zo.bfloat16(), bo, ktaps)               # bf16 twin: blur of the rounded f
    res["enc_odd_v2_bf16_f_rel"] = float((hf.float() - rf.float()).abs().max() / rf.float().abs().max())
    res["enc_odd_v2_bf16_rel"] = float((hfb.float() - rfb.float()).abs().max() / rfb.float().abs().max())
    a = torch.randn(3, 50, 70)                                          # odd HW and C (2 channel blocks)
    wt = torch.randn(3, 70, 3)
    want_rgb = torch.bmm(a.double(), wt.double()).float()
    res["rgb_fp32"] = float((T.to_rgb(a, wt) - want_rgb).abs().max() / want_rgb.abs().max())
    ab, wb = a.bfloat16(), wt.bfloat16()
    want_rgb = torch.bmm(ab.double(), wb.double()).float()
    res["rgb_bf16"] = float((T.to_rgb(ab, wb) - want_rgb).abs().max() / want_rgb.abs().max())
    cfg = GPENConfig(32, narrow=1 / 16)  # 32 channels a level: the model's passes (channel tails: c = 70, 37 above)
    m = load_model("synthetic", model=cfg)
    x = torch.rand(2, 3, 32, 32) * 2 - 1
    with torch.no_grad():
        fast = fuse(m, impl="triton")
        out = fast(x)
        res["model_uses_triton"] = bool(fast._use_triton)
        res["model_fp32"] = float((out - m(x)).abs().max())
    print("RESULT" + json.dumps(res))
""")


@pytest.mark.slow
def test_triton_kernels_match_torch_twins_in_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", _TRITON_SCRIPT], capture_output=True, text=True, env=env,
                          timeout=600, cwd=ROOT)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")), None)
    assert line, f"interpreter run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    res = json.loads(line[len("RESULT"):])
    for key in ("styled_up0", "styled_up1", "enc_f", "enc_fb", "enc_noblur", "enc_odd_v2", "rgb_fp32", "rgb_bf16"):
        assert res[key] <= 1e-5, (key, res)
    for key in ("styled_up0_bf16_rel", "styled_up1_bf16_rel"):
        assert res[key] <= 2e-2, (key, res)
    assert res["model_uses_triton"] is True
    assert res["enc_odd_v2_bf16_rel"] <= 2e-2 and res["enc_odd_v2_bf16_f_rel"] <= 2e-2, res
    assert res["model_fp32"] <= FP32_TOL


# ---------------------------------------------------------------------------------------------------------------
# GPU only


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graph_replay_matches_eager():
    model = load_model("synthetic", model="GPEN-BFR-256", device="cuda")
    fast = fuse(model, torch.bfloat16)
    x = faces(256, 2).cuda()
    with torch.no_grad():
        eager = fast(x)
        static_x = x.clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fast(static_x)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = fast(static_x)
        static_x.copy_(x.flip(0))
        g.replay()
        torch.cuda.synchronize()
    assert float((out - eager.flip(0)).abs().max()) <= 1e-2
    with torch.no_grad():
        assert psnr(eager, reference_forward(model, x)) >= 40.0


# ---------------------------------------------------------------------------------------------------------------
# the benchmark script itself


@pytest.mark.slow
def test_benchmark_script_tiny_cpu(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, str(ROOT / "benchmarks" / "generator_limit.py"), "--device", "cpu", "--model", "tiny",
           "--out", str(tmp_path), "--variants", "fused_bf16_torch,fused_bf16_triton", "--target-s", "0.01",
           "--n-ref", "2", "--batches", "1", "--inputs", "astronaut"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = list(tmp_path.glob("generator_limit_*.json"))
    assert len(files) == 1
    data = json.loads(files[0].read_text())
    assert {"torch", "command", "date_utc", "device_name"} <= set(data["env"])
    ok = [r for r in data["rows"] if r["status"] == "ok"]
    assert {r["variant"] for r in ok} == {"reference_fp32", "fused_bf16_torch"}
    for r in ok:
        assert r["finite"] and r["ms"] > 0 and r["faces_per_s"] > 0
        if r["variant"] == "fused_bf16_torch":
            assert r["psnr_db"] >= 40.0
    assert all(r["status"] == "skipped" for r in data["rows"] if r["variant"] == "fused_bf16_triton")
    assert data["inputs"]["tiny-32"].startswith("skimage astronaut")
    assert "TARGETS" in proc.stdout


_AHEAD_SCRIPT = textwrap.dedent("""
    import json, torch
    from gpen_tune.load import load_model
    from gpen_tune.model.fused import fuse
    from gpen_tune.ops import modconv_epilogue_triton as T
    from gpen_tune.ops.triton_support import compile_ahead
    with compile_ahead() as ahead:
        pass
    model = fuse(load_model("synthetic", model="GPEN-BFR-256", device="cuda"), torch.bfloat16)
    x = torch.rand(3, 3, 256, 256, device="cuda") * 2 - 1
    kernels = (T._styled_epilogue_kernel, T._bias_lrelu_kernel, T._blur_kernel, T._rgb_kernel)
    def compiled():
        return sum(len(caches[0]) for k in kernels for caches in k.device_caches.values())
    with torch.inference_mode():
        first = model(x)
        after_first = compiled()
        second = model(x)
    print("RESULT" + json.dumps({"ahead": ahead, "after_first": after_first, "after_second": compiled(),
                                 "same": bool(torch.equal(first, second))}))
""")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_first_call_compiles_its_kernels_ahead_once_each(tmp_path):
    """A fresh kernel cache: the first call's dry pass compiles every kernel (one per kernel, blur flag and tile
    shape, whatever the layer's spatial size: 8 for GPEN-BFR-256, as benchmarks/triton_compile.py enumerates them
    on the host, JSON 20261206-185525_triton_compile_GPEN-BFR-256_bf16.json), the real pass and the next call
    compile nothing more, and both give the same pixels."""
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path), PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", _AHEAD_SCRIPT], capture_output=True, text=True, env=env, timeout=600,
                          cwd=ROOT)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")), None)
    assert line, f"run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    res = json.loads(line[len("RESULT"):])
    assert res["same"], res
    assert 0 < res["after_first"] == res["after_second"] <= 8, res
    assert res["ahead"] is True, res             # this Triton compiles asynchronously (AsyncCompileMode)
