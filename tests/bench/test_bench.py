"""`gpen-tune bench` on a tiny generator, CPU: JSON schema, table, plot, skipped rows with reasons, bad input."""

from __future__ import annotations

import json
import stat

import numpy as np
import pytest
import torch
import typer
from PIL import Image
from typer.testing import CliRunner

from gpen_tune.bench import SCHEMA, select_rows
from gpen_tune.cli.bench import bench
from gpen_tune.file_mode import new_file_mode

pytestmark = pytest.mark.usefixtures("one_thread")   # see conftest.one_thread



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
            "--preset", "low-memory", "-o", str(out)]
    result = CliRunner().invoke(cli(), args)
    return result, out


@pytest.mark.slow
def test_bench_writes_json_markdown_and_png(bench_run):
    result, out = bench_run
    assert result.exit_code == 0, result.output
    jsons = list(out.glob("*.json"))
    assert len(jsons) == 1
    for path in (jsons[0], *out.glob("*.md")):             # the user's umask, as the images (not mkstemp's 0600)
        assert stat.S_IMODE(path.stat().st_mode) == new_file_mode(), path
    data = json.loads(jsons[0].read_text())
    assert data["schema"] == SCHEMA
    meta = data["meta"]
    for key in ("date", "torch", "cuda", "device_name", "command", "inputs", "faces", "model", "size"):
        assert key in meta
    assert meta["command"].startswith("gpen-tune bench --output ") and "--model tiny32 --device cpu" in meta["command"]
    assert "--rows default,amp,act_checkpoint,cuda_graph,lazy_detector" in meta["command"]
    assert meta["faces"] == 2
    names = [r["name"] for r in data["rows"]]
    assert names == ["default", "amp", "act_checkpoint", "cuda_graph", "lazy_detector", "custom"]

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
    assert rows["act_checkpoint"]["max_abs"] <= 1e-5  # same output up to float rounding
    assert rows["cuda_graph"]["status"] == "skipped"
    assert "CUDA Graphs need a CUDA device" in rows["cuda_graph"]["reason"]
    assert rows["lazy_detector"]["status"] == "skipped" and "nothing to free" in rows["lazy_detector"]["reason"]

    custom = rows["custom"]  # --preset low-memory: measured as its own row; the GPU-only part noted, not fatal
    assert custom["status"] == "ok" and custom["label"].startswith("--preset low-memory")
    assert custom["config"]["act_checkpoint"] and custom["config"]["amp"] == "bf16"
    assert "lazy_detector" in custom["skipped_switches"] and custom["psnr_db"] >= 40.0
    assert "preset low-memory" in result.output

    md = next(out.glob("*.md")).read_text()
    assert "| default (fp32 eager, all off) |" in md
    assert "| --cuda-graph | skipped: CUDA Graphs need a CUDA device" in md
    with Image.open(next(out.glob("*.png"))) as png:
        assert png.format == "PNG" and png.size[0] > 500
    assert "skip cuda_graph: CUDA Graphs" in result.output  # says why on the console too, naming the row once
    assert meta["complete"] is True and meta["tf32"] == "PyTorch defaults"
    for key in ("cudnn_allow_tf32", "matmul_allow_tf32", "float32_matmul_precision"):
        assert key in meta
    assert "fp32 default: fp32" in md and "Partial" not in md


@pytest.mark.slow
def test_every_finished_row_is_on_disk_before_the_next_one_starts(crops_dir, tmp_path):
    """A run killed by an outer timeout keeps what it finished: JSON + markdown after every row (atomic)."""
    from gpen_tune.bench import BenchSettings, run_bench, write_outputs

    seen: list[tuple[list[str], bool, str]] = []

    def after_row(partial):
        paths = write_outputs(partial, tmp_path, png=False)
        on_disk = json.loads(paths["json"].read_text())
        seen.append(([r["name"] for r in on_disk["rows"]], on_disk["meta"]["complete"], paths["md"].read_text()))

    settings = BenchSettings(model="tiny32", device="cpu", inputs=str(crops_dir), batch_sizes=(1,), repeats=1,
                             warmup=0, rows=["default", "cuda_graph", "act_checkpoint"], tf32=False)
    before = torch.backends.cudnn.allow_tf32
    final = run_bench(settings, log=lambda _: None, on_progress=after_row)
    assert [names for names, _, _ in seen] == [["default"], ["default", "cuda_graph", "act_checkpoint"]]
    assert not any(done for _, done, _ in seen) and "Partial" in seen[0][2]
    assert final["meta"]["complete"] and final["meta"]["tf32"] == "off (--no-tf32)"
    assert final["meta"]["cudnn_allow_tf32"] is False and final["meta"]["float32_matmul_precision"] == "highest"
    assert torch.backends.cudnn.allow_tf32 == before  # the flags are restored after the run


def test_bench_bad_inputs_fail_with_one_line_and_write_nothing(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tmp_path / "out"
    result = CliRunner().invoke(cli(), ["bench", "--model", "tiny32", "--device", "cpu", "--inputs", str(empty),
                                        "--batch-sizes", "1", "--rows", "default", "-o", str(out)])
    assert result.exit_code != 0
    assert "no images" in result.output and str(empty) in result.output
    assert not out.exists()


@pytest.fixture()
def offline_empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GPEN_TUNE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("GPEN_TUNE_OFFLINE", "1")


@pytest.mark.slow
def test_parse_mask_is_timed_on_the_same_crops_next_to_the_generator(crops_dir, tmp_path, offline_empty_cache):
    """--parse-mask without cached ParseNet weights: a synthetic ParseNet (said so), in the pipeline's dtype,
    timed at the bench's batch size; every row gets generator + parse mask numbers, the table their columns."""
    pytest.importorskip("facexlib")
    out = tmp_path / "out"
    result = CliRunner().invoke(cli(), ["bench", "--model", "tiny32", "--device", "cpu", "--inputs", str(crops_dir),
                                        "--batch-sizes", "1", "--rows", "default,amp", "--repeats", "1",
                                        "--warmup", "0", "--parse-mask", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "parse mask: ParseNet 512 px, float32 on cpu, weights: synthetic" in result.output
    data = json.loads(next(out.glob("*.json")).read_text())
    parse = data["parse_mask"]
    assert parse["status"] == "ok" and parse["synthetic"] and parse["dtype"] == "float32"
    assert parse["mask_iou_vs_fp32"] is None and parse["gflop_per_face"] > 100      # fp32 on the CPU: no IoU
    alone = parse["per_batch"]["1"]
    assert alone["ms_per_face"] > 0 and alone["faces_per_s"] == pytest.approx(1000 / alone["ms_per_face"])
    assert data["meta"]["command"].endswith(" --parse-mask") and data["settings"]["parse_mask"] is True
    for row in data["rows"]:
        assert row["status"] == "ok"
        both = row["with_parse_mask"]
        want = row["per_batch"]["1"]["ms_per_face"] + alone["ms_per_face"]
        assert both["ms_per_face_bs1"] == pytest.approx(want) and both["best_batch"] == 1
        assert both["best_faces_per_s"] == pytest.approx(1000 / want)
    md = next(out.glob("*.md")).read_text()
    assert "| ms/face bs1 + parse mask | faces/s + parse mask (best bs) |" in md
    assert "Parse mask (`--parse-mask`): ParseNet 512 px" in md and "weights: synthetic" in md
    assert "| parse mask bs | ms/call |" in md
    with Image.open(next(out.glob("*.png"))) as png:
        assert png.format == "PNG"


def test_bad_parse_weights_fail_with_one_line_and_write_nothing(crops_dir, tmp_path):
    out = tmp_path / "out"
    missing = tmp_path / "missing.pth"
    result = CliRunner().invoke(cli(), ["bench", "--model", "tiny32", "--device", "cpu", "--inputs", str(crops_dir),
                                        "--batch-sizes", "1", "--rows", "default", "--parse-weights", str(missing),
                                        "-o", str(out)])
    assert result.exit_code != 0
    assert "missing.pth: parsing weights file not found" in result.output
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


def test_the_library_imports_no_cli_module():
    """The arrows point one way: the CLI imports the library (`gpen_tune.bench` among it), never the reverse; only
    `python -m gpen_tune` (gpen_tune/__main__.py) starts the CLI."""
    import ast
    from pathlib import Path

    import gpen_tune

    root = Path(gpen_tune.__file__).parent
    back = []
    for path in root.rglob("*.py"):
        if path.relative_to(root).parts[0] in ("cli", "__main__.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            back += [f"{path.relative_to(root)}: {n}" for n in names if n.split(".")[:2] == ["gpen_tune", "cli"]]
    assert back == []
