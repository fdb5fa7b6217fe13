"""The fixture checkout is complete: its op sources (`face_model/op/*.cpp`, built at import on any Linux host with
CUDA, as upstream's are) compile with torch.utils.cpp_extension and compute what the pure-PyTorch paths do."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch
from op_build import missing_build_tools

pytestmark = pytest.mark.slow   # each extension is a C++ build (about 45 s on two cores)

OPS = Path(__file__).parents[1] / "fixtures" / "upstream_like" / "face_model" / "op"


def fixture_module(name: str):
    spec = importlib.util.spec_from_file_location(f"fixture_{name}", OPS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(name: str, source: str, tmp_path: Path):
    from torch.utils.cpp_extension import load

    why = missing_build_tools()
    if why:
        pytest.skip(f"building C++ op sources needs a compiler and ninja: {why}")
    folder = tmp_path / name
    folder.mkdir()
    return load(f"fixture_{name}", sources=[str(OPS / source)], build_directory=str(folder))


def test_each_op_module_names_sources_the_fixture_has():
    for module, source in (("fused_act", "fused_bias_act.cpp"), ("upfirdn2d", "upfirdn2d.cpp")):
        assert f"'{source}'" in (OPS / f"{module}.py").read_text() and (OPS / source).is_file()


def test_fused_bias_act_source_builds_and_matches_the_torch_path(tmp_path):
    op = build("fused", "fused_bias_act.cpp", tmp_path)
    native = fixture_module("fused_act")
    x, bias = torch.randn(2, 6, 5, 4, generator=torch.Generator().manual_seed(0)), torch.linspace(-1, 1, 6)
    want = native.fused_leaky_relu(x, bias, 0.2, math.sqrt(2), device="cpu")
    torch.testing.assert_close(op.fused_bias_act(x, bias, 0.2, math.sqrt(2)), want)


def test_upfirdn2d_source_builds_and_matches_the_torch_path(tmp_path):
    op = build("upfirdn2d", "upfirdn2d.cpp", tmp_path)
    native = fixture_module("upfirdn2d")
    x = torch.randn(2, 3, 9, 7, generator=torch.Generator().manual_seed(1))
    kernel = torch.outer(torch.tensor([1.0, 3.0, 3.0, 1.0]), torch.tensor([1.0, 3.0, 3.0, 1.0])) / 64
    for up, down, pad in ((1, 1, (2, 1)), (2, 1, (2, 1)), (1, 2, (1, 1))):
        want = native.upfirdn2d_native(x, kernel, up, down, *pad)
        torch.testing.assert_close(op.upfirdn2d(x, kernel, up, down, *pad), want)
