"""benchmarks/throughput.py --tiny on the CPU: the benchmark runs end to end and writes its JSON."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = 2          # grey levels between the benchmark's runs


@pytest.mark.slow
def test_benchmark_tiny_mode_writes_json(tmp_path):
    """benchmarks/throughput.py --tiny: serial and pipeline in one run (and the pipeline with the detector process,
    --ab-detector-process), JSON with device, versions, command. PNG outputs: JPEG's re-quantisation turns a
    one-level difference of the generator between batch sizes into up to ~4 levels."""
    import json

    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    cmd = [sys.executable, str(ROOT / "benchmarks" / "throughput.py"), "--tiny", "--images", "2", "--workers", "1",
           "--ab-detector-process", "--ext", "png", "--out", str(tmp_path)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    (path,) = tmp_path.glob("*_throughput_cpu_GPEN-BFR-256.json")
    data = json.loads(path.read_text())
    assert "--tiny" in data["command"] and data["environment"]["torch"] == torch.__version__
    assert set(data["runs"]) == {"serial", "pipeline", "pipeline_detector_process",
                                 "pipeline_detector_process_then_default"}
    proc = data["runs"]["pipeline_detector_process"]
    assert proc["images_ok"] == 2 and proc["outputs_vs_pipeline"]["compared"] == 2
    assert proc["outputs_vs_pipeline"]["max_abs"] <= TOLERANCE
    for run in data["runs"].values():
        assert run["images_ok"] == 2 and run["faces"] == 2 and run["faces_per_s"] > 0
    assert data["folder"]["per_kind"] == {"copy": 2}
    assert data["outputs_vs_serial"]["compared"] == 2 and data["outputs_vs_serial"]["max_abs"] <= TOLERANCE
    assert "limiting" in data["runs"]["pipeline"]["stage_analysis"]
