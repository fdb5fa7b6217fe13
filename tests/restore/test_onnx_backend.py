"""The onnxruntime backend behind the one Restorer: same crops out as the PyTorch generator, the non-finite guard,
the OOM split on a real ONNX Runtime allocation failure, skipped switches reported, and the missing extra."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from model_configs import SMALLEST

from gpen_tune.load import load_model
from gpen_tune.restore.restorer import build_restorer
from gpen_tune.tune import TuneConfig

pytest.importorskip("onnxruntime")
ROOT = Path(__file__).resolve().parents[2]


def crops(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, SMALLEST.size, SMALLEST.size, 3), dtype=np.uint8)


@pytest.fixture(autouse=True)
def _cache(home):
    """Every test here exports into its own empty cache folder."""
    return home


def test_onnxruntime_restorer_gives_the_torch_restorers_crops(home):
    torch_r = build_restorer(load_model("synthetic", model=SMALLEST), TuneConfig(), device="cpu", max_batch=4)
    ort_r = build_restorer(load_model("synthetic", model=SMALLEST), TuneConfig(backend="onnxruntime", fused=True),
                           device="cpu", max_batch=4)
    batch = crops(6)
    want, got = torch_r.restore_crops(batch), ort_r.restore_crops(batch)
    assert got.shape == want.shape and got.dtype == np.uint8
    assert np.abs(got.astype(int) - want.astype(int)).max() <= 1
    assert ort_r.times.batch_sizes == {4: 1, 2: 1}                    # the Restorer's batching, unchanged
    assert "fused" in ort_r.skipped and not ort_r.effective.fused
    assert ort_r.effective.describe().endswith("backend=onnxruntime")
    assert len(list((home / "onnx").glob("*.onnx"))) == 1 and "exported and cached" in ort_r.notes[0]
    again = build_restorer(load_model("synthetic", model=SMALLEST), TuneConfig(backend="onnxruntime"),
                           device="cpu", max_batch=4)                 # the same weights: the cached graph
    assert "from the cache" in again.notes[0]
    assert np.array_equal(again.restore_crops(batch), got)


def test_non_finite_output_keeps_the_input_crop(home):
    build_restorer(load_model("synthetic", model=SMALLEST), TuneConfig(backend="onnxruntime"), device="cpu")
    net = load_model("synthetic", model=SMALLEST)
    with torch.no_grad():
        for p in net.parameters():
            p.fill_(float("nan"))
    restorer = build_restorer(net, TuneConfig(backend="onnxruntime"), device="cpu", max_batch=2)
    batch = crops(3, seed=1)
    assert np.array_equal(restorer.restore_crops(batch), batch)
    assert restorer.nonfinite_faces == 3 and any("non-finite" in msg for msg in restorer.fallbacks)
    assert "exported" in restorer.notes[0]             # the same file's weights changed in memory: their own graph
    assert len(list((home / "onnx").glob("*.onnx"))) == 2


def test_onnxruntime_backend_refuses_a_cuda_device_in_one_line():
    with pytest.raises(ValueError, match="--backend onnxruntime runs on the CPU"):
        build_restorer(load_model("synthetic", model=SMALLEST), TuneConfig(backend="onnxruntime"),
                       device="meta")


@pytest.mark.slow
def test_an_onnxruntime_allocation_failure_splits_the_batch():
    """A real ONNX Runtime arena capped at 16 MiB (process-wide, hence a child process): batch 64 of the smallest
    generator fails to allocate, the Restorer drops to smaller batches and gives the crops batch 1 gives."""
    script = textwrap.dedent("""
        import numpy as np, onnxruntime as ort
        from model_configs import SMALLEST
        from gpen_tune.export.onnx import onnx_graph
        from gpen_tune.load import load_model
        from gpen_tune.restore.onnx_backend import OnnxRuntimeForward
        from gpen_tune.restore.restorer import Restorer
        info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
        ort.create_and_register_allocator(info, ort.OrtArenaCfg(16 * 2**20, -1, -1, -1))
        opts = ort.SessionOptions()
        opts.add_session_config_entry("session.use_env_allocators", "1")
        opts.log_severity_level = 4
        net = load_model("synthetic", model=SMALLEST)
        session = ort.InferenceSession(onnx_graph(net).SerializeToString(), opts, providers=["CPUExecutionProvider"])
        crops = np.random.default_rng(0).integers(0, 256, (64, 16, 16, 3), dtype=np.uint8)
        big = Restorer(OnnxRuntimeForward(session), max_batch=64)
        out = big.restore_crops(crops)
        one = Restorer(OnnxRuntimeForward(session), max_batch=1).restore_crops(crops)
        assert big.limit < 64 and big.times.oom_splits >= 1, (big.limit, big.fallbacks)
        assert np.array_equal(out, one)
        print("split to", big.limit)
    """)
    env = {"PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and "split to" in proc.stdout, proc.stderr[-3000:]


def test_missing_onnxruntime_is_one_line_naming_the_extra(tmp_path):
    """onnxruntime made unimportable in a child process: `gpen-tune export` and `enhance --backend onnxruntime`
    each answer with one line naming the onnx extra, exit 1."""
    blocker = textwrap.dedent("""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "onnxruntime":
                    raise ModuleNotFoundError(name)
        sys.meta_path.insert(0, Block())
        sys.argv = ["gpen-tune", *sys.argv[1:]]
        from gpen_tune.cli import main
        main()
    """)
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    runs = {
        "export": ["export", "GPEN-BFR-256", "--weights", "synthetic", "-o", str(tmp_path / "m.onnx")],
        "enhance": ["enhance", str(tmp_path / "none.png"), "-o", str(tmp_path / "out"), "--weights", "synthetic",
                    "--model", "GPEN-BFR-256", "--device", "cpu", "--backend", "onnxruntime"],
    }
    from PIL import Image

    Image.new("RGB", (64, 64)).save(tmp_path / "none.png")
    for name, args in runs.items():
        proc = subprocess.run([sys.executable, "-c", blocker, *args], capture_output=True, text=True, env=env,
                              timeout=300)
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert proc.returncode == 1, (name, proc.stderr[-2000:])
        assert "gpen-tune[onnx]" in lines[-1] and "onnxruntime" in lines[-1], (name, lines)
        assert "Traceback" not in proc.stderr


def test_bench_has_an_onnxruntime_row_measured_on_the_cpu_only():
    from gpen_tune.bench.rows import select_rows
    from gpen_tune.bench.runner import skip_reason

    fp32, fp16 = select_rows(["onnxruntime", "onnxruntime_fp16"])
    assert fp32.cfg.backend == fp16.cfg.backend == "onnxruntime" and fp16.cfg.amp == "fp16"
    assert skip_reason(fp32, torch.device("cpu"), explicit=False) is None
    assert "runs on the CPU" in skip_reason(fp16, torch.device("cuda"), explicit=True)
