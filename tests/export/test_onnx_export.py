"""`gpen-tune export --format onnx`: the graph (standard operators TensorRT's parser takes, onnx.checker, dynamic
batch), its agreement with the PyTorch generator in ONNX Runtime, its metadata, and the facefusion/ReActor
convention against `gpen-tune enhance`'s restored crop."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest_weights import checkpoint_file
from model_configs import SMALLEST
from PIL import Image
from typer.testing import CliRunner

from gpen_tune.cli import app
from gpen_tune.export.onnx import (
    FP32_MAX_ABS,
    HALF_MIN_PSNR_DB,
    INPUT_NAME,
    OUTPUT_NAME,
    onnx_graph,
    ort_session,
    read_metadata,
    run_convention,
)
from gpen_tune.face import samples
from gpen_tune.load import load_model
from gpen_tune.model.io import max_abs, psnr
from gpen_tune.weights.integrity import sha256_of

onnx = pytest.importorskip("onnx")

TENSORRT_OPS = Path(__file__).with_name("tensorrt_onnx_operators.txt")


def tensorrt_operators() -> set[str]:
    lines = [line for line in TENSORRT_OPS.read_text().splitlines() if not line.startswith("#")]
    return {op for line in lines for op in line.split()}


@pytest.fixture(scope="module")
def smallest():
    return load_model("synthetic", model=SMALLEST)


@pytest.fixture(scope="module")
def graph(smallest):
    return onnx_graph(smallest, "fp32")


def test_graph_takes_only_operators_tensorrts_parser_supports(graph):
    onnx.checker.check_model(graph, full_check=True)
    ops = {node.op_type for node in graph.graph.node}
    assert ops <= tensorrt_operators(), f"not on TensorRT's list: {sorted(ops - tensorrt_operators())}"
    assert {node.domain for node in graph.graph.node} <= {"", "ai.onnx"}            # no custom operators
    assert {"Conv", "ConvTranspose", "Gemm"} <= ops
    initializers = {init.name for init in graph.graph.initializer}
    convs = [n for n in graph.graph.node if n.op_type in ("Conv", "ConvTranspose")]
    assert all(n.input[1] in initializers for n in convs)        # TensorRT 8.4 wanted constant conv weights
    assert graph.opset_import[0].version >= 18


def test_io_names_and_dynamic_batch_follow_the_convention(graph):
    (inp,), (out,) = graph.graph.input, graph.graph.output
    assert (inp.name, out.name) == (INPUT_NAME, OUTPUT_NAME) == ("input", "output")
    for value in (inp, out):
        dims = value.type.tensor_type.shape.dim
        assert value.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
        assert dims[0].dim_param and not dims[0].dim_value                     # dynamic batch
        assert [d.dim_value for d in dims[1:]] == [3, SMALLEST.size, SMALLEST.size]


@pytest.mark.parametrize("batch", [1, 3])
def test_fp32_graph_matches_pytorch_at_any_batch(smallest, graph, batch):
    x = torch.rand(batch, 3, SMALLEST.size, SMALLEST.size, generator=torch.Generator().manual_seed(batch)) * 2 - 1
    with torch.no_grad():
        ref = smallest(x)
    got = torch.from_numpy(ort_session(graph.SerializeToString()).run(None, {INPUT_NAME: x.numpy()})[0])
    assert max_abs(got, ref) <= FP32_MAX_ABS


def test_fp16_graph_keeps_float32_io_and_40_db(smallest):
    half = onnx_graph(smallest, "fp16", batch=2)
    assert half.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert half.graph.output[0].type.tensor_type.shape.dim[0].dim_value == 2                # the fixed batch
    assert any(init.data_type == onnx.TensorProto.FLOAT16 for init in half.graph.initializer)
    x = torch.rand(2, 3, SMALLEST.size, SMALLEST.size, generator=torch.Generator().manual_seed(0)) * 2 - 1
    with torch.no_grad():
        ref = smallest(x)
    got = torch.from_numpy(ort_session(half.SerializeToString()).run(None, {INPUT_NAME: x.numpy()})[0])
    assert psnr(got, ref) >= HALF_MIN_PSNR_DB


@pytest.mark.slow
def test_exported_file_in_the_convention_gives_enhances_restored_crop(tmp_path, home):
    """A GPEN-BFR-256 checkpoint in the official layout: `gpen-tune export` writes a checked file with its figures
    and the checkpoint's sha256; run with plain onnxruntime and the convention's pre/post-processing on the
    aligned face `gpen-tune enhance --save-faces` wrote, it gives enhance's restored crop, and so does
    `enhance --backend onnxruntime`."""
    ckpt = checkpoint_file("GPEN-BFR-256")
    path = tmp_path / "gpen_bfr_256.onnx"
    res = CliRunner().invoke(app, ["export", "GPEN-BFR-256", "--weights", str(ckpt), "-o", str(path)])
    assert res.exit_code == 0, res.output
    assert "max-abs" in res.output and sha256_of(ckpt) in res.output
    meta = read_metadata(path)
    assert meta["weights_sha256"] == sha256_of(ckpt) and meta["batch"] == "dynamic"
    assert float(meta["verify_max_abs"]) <= FP32_MAX_ABS and int(meta["verify_faces"]) == 2
    assert not list(tmp_path.glob(".*.part"))

    photo = tmp_path / "astronaut.png"
    Image.fromarray(samples.astronaut()).save(photo)
    res = CliRunner().invoke(app, ["enhance", str(photo), "-o", str(tmp_path / "out"), "--model", "GPEN-BFR-256",
                                   "--weights", str(ckpt), "--device", "cpu", "--detector", "mtcnn",
                                   "--preset", "none", "--save-faces"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    side_by_side = np.asarray(Image.open(tmp_path / "out" / "faces" / "astronaut_face00.png").convert("RGB"))
    aligned, restored = side_by_side[:, :256], side_by_side[:, 256:]

    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = run_convention(session, aligned[None])[0]
    diff = np.abs(got.astype(int) - restored.astype(int))
    assert diff.max() <= 1 and (diff > 0).mean() < 0.01          # rounding of float sums in another order only

    res = CliRunner().invoke(app, ["enhance", str(photo), "-o", str(tmp_path / "ort"), "--model", "GPEN-BFR-256",
                                   "--weights", str(ckpt), "--device", "cpu", "--detector", "mtcnn",
                                   "--save-faces", "--backend", "onnxruntime"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    ort_face = np.asarray(Image.open(tmp_path / "ort" / "faces" / "astronaut_face00.png").convert("RGB"))
    assert np.array_equal(ort_face[:, :256], aligned)
    assert np.abs(ort_face[:, 256:].astype(int) - restored.astype(int)).max() <= 1


def test_existing_output_is_refused_and_kept(tmp_path):
    target = tmp_path / "model.onnx"
    target.write_bytes(b"keep me")
    res = CliRunner().invoke(app, ["export", "GPEN-BFR-256", "--weights", "synthetic", "-o", str(target)])
    assert res.exit_code == 1 and "--overwrite" in res.output
    assert target.read_bytes() == b"keep me"
