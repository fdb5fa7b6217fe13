"""`gpen-tune bench --device cpu`: which rows are skipped and why, labels in the CLI's flags, the log-scale plot,
and a real short run with the default rows on a tiny generator."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from PIL import Image

from gpen_tune.bench import BenchSettings, run_bench, select_rows, write_outputs
from gpen_tune.bench.report import markdown_table, needs_log_scale
from gpen_tune.bench.runner import skip_reason
from gpen_tune.face import samples
from gpen_tune.tune import amp
from gpen_tune.tune.hardware import cpu_capabilities
from gpen_tune.tune.options import TuneConfig

CPU = torch.device("cpu")
ZEN4 = cpu_capabilities("flags\t: avx2 avx512f avx512_bf16\n", cores=2)
ZEN3 = cpu_capabilities("flags\t: avx2 fma\n", cores=2)


def rows_by_name() -> dict:
    return {r.name: r for r in select_rows(["default", "amp", "amp_fp16", "act_checkpoint", "cuda_graph",
                                            "lazy_detector", "fused", "1+2", "preset:cpu"])}


def test_rows_are_labelled_with_the_cli_flags():
    rows = rows_by_name()
    assert rows["amp"].label == "--amp bf16" and rows["amp_fp16"].label == "--amp fp16"
    assert rows["act_checkpoint"].label == "--act-checkpoint" and rows["fused"].label == "--fused"
    assert rows["1+2"].label == "1+2: --compile default --lazy-detector"
    assert rows["preset:cpu"].label == "--preset cpu"
    for row in rows.values():   # no internal field names in what the table and the plot show
        assert "act_checkpoint" not in row.label and "amp_" not in row.label and "amp=" not in row.label


def test_rows_that_cannot_be_faster_on_this_cpu_are_skipped_unless_asked_for():
    rows = rows_by_name()
    fp16, bf16 = rows["amp_fp16"], rows["amp"]
    reason = skip_reason(fp16, CPU, explicit=False, cpu=ZEN4)
    assert "no native fp16" in reason and "--rows" in reason
    assert skip_reason(fp16, CPU, explicit=True, cpu=ZEN4) is None        # asked for with --rows: measured
    assert skip_reason(bf16, CPU, explicit=False, cpu=ZEN4) is None
    assert "no native bf16" in skip_reason(bf16, CPU, explicit=False, cpu=ZEN3)
    assert "CUDA Graphs need a CUDA device" in skip_reason(rows["cuda_graph"], CPU, explicit=False, cpu=ZEN4)
    lazy = skip_reason(rows["lazy_detector"], CPU, explicit=False, cpu=ZEN4)
    assert "nothing to free" in lazy and not lazy.startswith("lazy_detector")   # the log line names the row once
    assert "torch.compile on the CPU" in skip_reason(rows["1+2"], CPU, explicit=False, cpu=ZEN4)
    assert skip_reason(rows["fused"], CPU, explicit=False, cpu=ZEN3) is None


def test_a_slow_outlier_puts_the_panel_on_a_log_scale():
    assert needs_log_scale([186.0, 137.0, 28_800.0])
    assert not needs_log_scale([186.0, 137.0, 150.0])
    assert not needs_log_scale([0.0, 5.0]) and not needs_log_scale([])


@pytest.fixture(scope="module")
def crops_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("crops")
    for i, crop in enumerate(samples.aligned_face_crops(64, n=2)):
        Image.fromarray(crop).save(folder / f"face_{i}.png")
    return folder


@pytest.mark.slow
def test_default_rows_on_the_cpu_run_and_write_json_table_and_plot(crops_dir, tmp_path, home):
    """The default row set at batch 1 on the CPU (tiny generator): GPU-only and compile rows skipped with their
    reasons, the bf16 / fp16 rows skipped exactly when this CPU has no native bf16 / fp16, the rest measured (the
    onnxruntime backend's row among them, with the same parity columns); outputs written."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        settings = BenchSettings(model="tiny32", device="cpu", inputs=str(crops_dir), batch_sizes=(1,),
                                 repeats=1, warmup=0, command="gpen-tune bench --device cpu --model tiny32")
        result = run_bench(settings, log=lambda _: None)
    finally:
        torch.set_num_threads(before)
    rows = {r["name"]: r for r in result["rows"]}
    assert rows["default"]["status"] == "ok" and rows["fused"]["status"] == "ok"
    if importlib.util.find_spec("onnxruntime") is not None:
        ort = rows["onnxruntime"]
        assert ort["status"] == "ok" and ort["max_abs"] <= 1e-4 and ort["label"] == "--backend onnxruntime"
    assert rows["cuda_graph"]["status"] == "skipped" and rows["compile"]["status"] == "skipped"
    for name, half in (("amp", "bf16"), ("amp_fp16", "fp16")):
        slower = amp.pays_off("cpu", TuneConfig(amp=half))
        assert rows[name]["status"] == ("skipped" if slower else "ok")
        if slower:
            assert rows[name]["reason"].startswith(f"--amp {half}: ") and "--rows" in rows[name]["reason"]
    assert rows["amp"]["label"] == "--amp bf16" and rows["act_checkpoint"]["label"] == "--act-checkpoint"
    paths = write_outputs(result, tmp_path)
    data = json.loads(paths["json"].read_text())
    assert data["meta"]["complete"] and data["meta"]["command"] == settings.command
    table = markdown_table(result)
    assert "| --amp bf16 |" in table and "| --act-checkpoint |" in table
    with Image.open(paths["png"]) as png:
        assert png.format == "PNG" and png.size[0] > 500
