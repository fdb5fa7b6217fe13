"""The Triton 4x4 FIR (gpen_tune/ops/fir_triton.py) against PyTorch's conv path, run through Triton's CPU
interpreter in a subprocess (TRITON_INTERPRET=1 must be set before Triton is imported)."""

from __future__ import annotations

import os

import pytest
from triton_interp import run_in_interpreter

_SCRIPT = r"""
import json, sys, torch
sys.path.insert(0, "tests")
from gpen_reference import gpen_forward_ref
from gpen_tune.model import GPENConfig
from gpen_tune.load import load_model
from gpen_tune.ops import fir_triton
from gpen_tune.ops.fir import make_kernel, upfirdn2d

res = {}
g = torch.Generator().manual_seed(0)
cases = [("sym1", (2, 5, 19, 23), (1, 1), 1, 1, torch.float32), ("sym2", (1, 3, 17, 70), (2, 2), 1, 1, torch.float32),
         ("up2", (2, 3, 9, 11), (2, 1), 2, 1, torch.float32), ("down2", (1, 2, 12, 13), (1, 1), 1, 2, torch.float32),
         ("bf16", (1, 4, 20, 20), (1, 1), 1, 1, torch.bfloat16), ("asym", (1, 3, 11, 13), (2, 1), 1, 1, torch.float32)]
for name, shape, pad, up, down, dtype in cases:
    x = torch.randn(shape, generator=g).to(dtype)
    k = make_kernel((1, 3, 3, 1)) * 4
    if name == "asym":                       # not flip-symmetric: the kernel must be applied as a true convolution
        k = torch.arange(16, dtype=torch.float32).reshape(4, 4) / 120
    bias = torch.randn(shape[1], generator=g).to(dtype)
    res[name + "_applies"] = fir_triton.applies(x, k)
    got = upfirdn2d(x, k, up=up, down=down, pad=pad, bias=bias)
    want = upfirdn2d(x.double(), k.double(), up=up, down=down, pad=pad, bias=bias.double(), impl="torch")
    res[name] = float((got.double() - want).abs().max() / want.abs().max()) if got.shape == want.shape else 1.0
# leaky ReLU in the kernel's epilogue, written into the first half of a batch-1 concat buffer (StyledConv's use)
x = torch.randn(1, 3, 12, 14, generator=g)
bias = torch.randn(3, generator=g)
buf = torch.full((1, 6, 12, 14), 7.0)
k = make_kernel((1, 3, 3, 1))
got = upfirdn2d(x, k, pad=(2, 1), bias=bias, out=buf[:, :3], negative_slope=0.2)
want = torch.nn.functional.leaky_relu(upfirdn2d(x, k, pad=(2, 1), bias=bias, impl="torch"), 0.2)
res["act_into_slice"] = float((buf[:, :3] - want).abs().max())
res["act_returns_out"] = got.data_ptr() == buf.data_ptr()
res["act_other_half_untouched"] = bool((buf[:, 3:] == 7.0).all())
x = torch.randn(1, 2, 8, 8)
k = make_kernel((1, 3, 3, 1))
res["skips_non_contiguous"] = not fir_triton.applies(x.transpose(2, 3), k)
res["skips_grad"] = not fir_triton.applies(x.requires_grad_(), k)
cfg = GPENConfig(32, narrow=1 / 32)       # 16 channels a level: every FIR of the model, batches of 2 and 1
model = load_model("synthetic", model=cfg)
sd = {key: v.clone() for key, v in model.state_dict().items()}
xs = torch.rand(2, 3, 32, 32, generator=g) * 2 - 1
with torch.no_grad():
    res["model_vs_reference"] = float((model(xs) - gpen_forward_ref(sd, xs)).abs().max())
    res["model_bs1_vs_reference"] = float((model(xs[:1]) - gpen_forward_ref(sd, xs[:1])).abs().max())
print("RESULT" + json.dumps(res))
"""


@pytest.mark.slow
def test_triton_fir_matches_the_conv_path_in_interpreter():
    res = run_in_interpreter(_SCRIPT)
    for name in ("sym1", "sym2", "up2", "down2", "asym"):
        assert res[name + "_applies"] is True and res[name] <= 1e-6, (name, res)
    assert res["bf16_applies"] is True and res["bf16"] <= 1e-2, res
    assert res["skips_non_contiguous"] and res["skips_grad"], res
    assert res["act_into_slice"] <= 1e-6 and res["act_returns_out"] and res["act_other_half_untouched"], res
    assert res["model_vs_reference"] <= 1e-4 and res["model_bs1_vs_reference"] <= 1e-4, res


def test_cpu_tensors_take_the_conv_path():
    import torch

    from gpen_tune.ops import fir_triton
    from gpen_tune.ops.fir import make_kernel

    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the interpreter runs Triton on the CPU")
    assert not fir_triton.applies(torch.zeros(1, 2, 8, 8), make_kernel((1, 3, 3, 1)))
    assert not fir_triton.applies(torch.zeros(1, 2, 2048, 2048), make_kernel((1, 3, 3, 1)))


@pytest.mark.gpu
def test_cuda_dispatch_and_values():
    """On a GPU: auto mode keeps small eager FIRs on PyTorch's conv, takes Triton for big tensors and inside a graph
    capture, and both paths give the same values (fp32 to 1e-5, bf16 to bf16 rounding)."""
    import torch

    from gpen_tune.ops import fir_triton
    from gpen_tune.ops.fir import make_kernel, upfirdn2d

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    k = make_kernel((1, 3, 3, 1)).cuda() * 4
    small = torch.randn(1, 8, 32, 32, device="cuda")
    big = torch.randn(1, 32, 512, 512, device="cuda")
    assert fir_triton.failure() is None
    assert not fir_triton.applies(small, k) and fir_triton.applies(big, k)
    assert fir_triton.applies(small, k, impl="triton") and not fir_triton.applies(big, k, impl="torch")
    with fir_triton.for_graph_capture():
        assert fir_triton.applies(small, k)
    for x, dtype, tol in ((big, torch.float32, 1e-5), (big, torch.bfloat16, 2e-2)):
        x = x.to(dtype)
        bias = torch.randn(x.shape[1], device="cuda", dtype=dtype)
        got = upfirdn2d(x, k, pad=(2, 1), bias=bias)
        want = upfirdn2d(x.float(), k, pad=(2, 1), bias=bias.float(), impl="torch")
        assert got.shape == want.shape and got.dtype == dtype
        assert float((got.float() - want).abs().max() / want.abs().max()) <= tol


_DISABLE_SCRIPT = r"""
import warnings, torch
from gpen_tune.ops import fir_triton
x, k = torch.zeros(1, 2, 8, 8), torch.ones(4, 4) / 16
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    fir_triton.disable("CalledProcessError: ptxas failed")
    fir_triton.disable("again")                      # a second failure does not warn again
assert [str(w.message) for w in seen] == [
    "Triton FIR disabled, using PyTorch's conv instead: CalledProcessError: ptxas failed"], seen
assert fir_triton.failure() == "CalledProcessError: ptxas failed"
assert not fir_triton.applies(x, k, impl="triton") and not fir_triton.applies(x, k)
print("OK")
"""


@pytest.mark.slow
def test_disable_after_a_failure_warns_once_and_keeps_the_conv_path():
    """A Triton compile/launch failure turns the kernel off for the process (upfirdn2d then uses the conv); in a
    process of its own, as the turn-off lasts for the process."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(root))
    proc = subprocess.run([sys.executable, "-c", _DISABLE_SCRIPT], capture_output=True, text=True, env=env,
                          cwd=root, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stderr[-2000:]
