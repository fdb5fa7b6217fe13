"""`gpen-tune bench` on a tiny generator, CPU: JSON schema, table, plot, skipped rows with reasons, bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import typer
from PIL import Image
from typer.testing import CliRunner

from gpen_tune.bench import SCHEMA, select_rows
from gpen_tune.cli.bench import bench


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread: on a small shared CI machine two busy-waiting threads per process are many times
    slower than one (measured here: 0.1 s vs 0.7 s per tiny forward under load)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)



def cli() -> typer.Typer:
    """A Typer app holding just `bench` (the real command function), invoked as `bench ...` like gpen-tune."""
    app = typer.Typer()
    app.callback()(lambda: None)
    app.command()(bench)
    return app


@pytest.fixture(scope="module")
def crops_dir(tmp_path_factory):
    """Two face crops cut from skimage's astronaut (real photo), one PNG and one JPEG, different sizes."""
    from skimage import data

    folder = tmp_path_factory.mktemp("crops")
    img = data.astronaut()
    Image.fromarray(img[30:210, 150:330]).save(folder / "face_a.png")
    Image.fromarray(img[10:250, 120:360]).save(folder / "face_b.jpg", quality=95)
    (folder / "notes.txt").write_text("not an image: ignored")
    return folder


@pytest.fixture(scope="module")
def bench_run(crops_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench_out")
    args = ["bench", "--model", "tiny32", "--device", "cpu", "--inputs", str(crops_dir), "--batch-sizes", "1,2",
            "--rows", "default,amp,act_checkpoint,cuda_graph,lazy_detector", "--repeats", "2", "--warmup", "0",
            "-o", str(out)]
    result = CliRunner().invoke(cli(), args)
    return result, out


def test_bench_writes_json_markdown_and_png(bench_run):
    result, out = bench_run
    assert result.exit_code == 0, result.output
    jsons = list(out.glob("*.json"))
    assert len(jsons) == 1
    data = json.loads(jsons[0].read_text())
    assert data["schema"] == SCHEMA
    meta = data["meta"]
    for key in ("date", "torch", "cuda", "device_name", "command", "inputs", "faces", "model", "size"):
        assert key in meta
    assert meta["command"].startswith("gpen-tune bench --output ") and "--model tiny32 --device cpu" in meta["command"]
    assert "--rows default,amp,act_checkpoint,cuda_graph,lazy_detector" in meta["command"]
    assert meta["faces"] == 2
    assert [r["name"] for r in data["rows"]] == ["default", "amp", "act_checkpoint", "cuda_graph", "lazy_detector"]

    rows = {r["name"]: r for r in data["rows"]}
    default = rows["default"]
    assert default["status"] == "ok" and default["max_abs"] == 0
    for bs in ("1", "2"):
        b = default["per_batch"][bs]
        for key in ("median_ms", "rel_iqr", "ms_per_face", "faces_per_s", "peak_allocated_mib",
                    "peak_reserved_mib", "warmup_s", "max_abs_vs_bs1", "times_ms"):
            assert key in b
        assert len(b["times_ms"]) == 2 and b["median_ms"] > 0
        assert b["max_abs_vs_bs1"] <= 1e-4  # a batch gives the same faces as one at a time
    assert default["best_batch"] in (1, 2) and default["ms_per_face_bs1"] > 0

    assert rows["amp"]["psnr_db"] >= 40.0 and rows["amp"]["effective"] == "amp=bf16"
    assert rows["act_checkpoint"]["max_abs"] == 0.0  # bit-identical
    assert rows["cuda_graph"]["status"] == "skipped"
    assert "CUDA Graphs need a CUDA device" in rows["cuda_graph"]["reason"]
    assert rows["lazy_detector"]["status"] == "skipped" and "nothing to free" in rows["lazy_detector"]["reason"]

    md = next(out.glob("*.md")).read_text()
    assert "| default (fp32 eager, all off) |" in md and "skipped: cuda_graph: CUDA Graphs need a CUDA device" in md
    with Image.open(next(out.glob("*.png"))) as png:
        assert png.format == "PNG" and png.size[0] > 500
    assert "skip cuda_graph" in result.output  # says why on the console too


def test_bench_bad_inputs_fail_with_one_line_and_write_nothing(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tmp_path / "out"
    result = CliRunner().invoke(cli(), ["bench", "--model", "tiny32", "--device", "cpu", "--inputs", str(empty),
                                        "--batch-sizes", "1", "--rows", "default", "-o", str(out)])
    assert result.exit_code != 0
    assert "no images" in result.output and str(empty) in result.output
    assert not out.exists()


def test_unknown_row_is_refused_with_the_list():
    with pytest.raises(ValueError, match="choose from default, 1, 1\\+2"):
        select_rows(["default", "warp-speed"])


def test_rows_cover_default_cumulative_and_alone():
    names = [r.name for r in select_rows(None)]
    assert names[:6] == ["default", "1", "1+2", "1+2+3", "1-4", "1-6"]
    assert {"lazy_detector", "compile", "amp", "act_checkpoint", "face_crop", "cuda_graph", "amp_fp16"} <= set(names)
    six = {r.name: r for r in select_rows(None)}["1-6"].cfg
    assert six.lazy_detector and six.compile == "default" and six.amp == "bf16" and six.act_checkpoint
    assert six.face_crop and six.cuda_graph and not six.fused
    assert np.all([r.cfg.enabled() == [] for r in select_rows(["default"])])
