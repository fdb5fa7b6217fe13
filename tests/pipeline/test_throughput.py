"""The pipelined folder runner (gpen_tune.throughput) against the serial driver, on real photos, on the CPU.

A tiny synthetic GPEN (64 px, narrow 0.25) keeps the generator cheap; detection is the real offline MTCNN.
Stated tolerance: pipelined outputs equal the serial outputs within 2 grey levels per pixel (the only difference
is which faces share a generator batch, which changes float summation order).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from gpen_tune.face.pipeline import Enhancer, EnhanceSettings, OutputNaming
from gpen_tune.throughput import enhance_folder
from gpen_tune.throughput.runner import RunnerConfig, default_workers, run_pipeline
from gpen_tune.throughput.stages import EnhancerStages

from gpen_tune.face import samples
from gpen_tune.load import load_model
from gpen_tune.model.configs import GPENConfig
from gpen_tune.restore.buckets import bucket_floor, split_sizes
from gpen_tune.restore.restorer import Restorer

TOLERANCE = 2          # grey levels, pipelined vs serial output
ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------------- fixtures


def _write(path: Path, rgb: np.ndarray) -> Path:
    cv2.imwrite(str(path), np.ascontiguousarray(rgb[..., ::-1]))
    return path


@pytest.fixture(scope="module")
def enhancer():
    model = load_model("synthetic", model=GPENConfig(64, narrow=0.25))
    enh = Enhancer(EnhanceSettings(device="cpu", detector="mtcnn", batch_size=4), model=model)
    yield enh
    enh.close()


@pytest.fixture(scope="module")
def mixed_folder(tmp_path_factory) -> Path:
    """astronaut, grace_hopper, a 4-face mosaic, a face-free image and a broken file."""
    d = tmp_path_factory.mktemp("mixed")
    _write(d / "a_astronaut.png", samples.astronaut())
    _write(d / "b_grace.jpg", samples.grace_hopper())
    _write(d / "c_mosaic.png", samples.mosaic(4, 0))
    _write(d / "d_noface.png", np.full((96, 128, 3), 90, np.uint8))
    (d / "e_broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    return d


@pytest.fixture(scope="module")
def serial_run(enhancer, mixed_folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("serial")       # PNG: the comparison sees the pixels, not JPEG's rounding of them
    return out, enhance_folder(mixed_folder, out, enhancer=enhancer, serial=True, ext="png")


def _copy_folder(folder: Path, dest: Path) -> Path:
    dest.mkdir()
    for p in folder.iterdir():
        (dest / p.name).write_bytes(p.read_bytes())
    return dest


def _no_partial_files(folder: Path) -> None:
    leftovers = [p.name for p in folder.rglob("*") if p.name.endswith((".part", ".tmp")) or p.name.startswith(".")]
    assert leftovers == []


def _all_decodable(folder: Path) -> list[Path]:
    files = sorted(p for p in folder.iterdir() if p.is_file())
    for p in files:
        assert cv2.imread(str(p)) is not None, f"{p} is not a complete image"
    return files


# ---------------------------------------------------------------------------------------------------- parity


def test_pipeline_matches_serial_on_mixed_folder(enhancer, mixed_folder, serial_run, tmp_path):
    serial_out, serial = serial_run
    # detect_batch=3: a prepare worker decodes and detects up to 3 images per call (the broken file inside a group)
    piped = enhance_folder(mixed_folder, tmp_path, enhancer=enhancer, workers=2, max_batch=4, detect_batch=3,
                           ext="png")
    assert [r.path.name for r in piped.results] == [r.path.name for r in serial.results]
    assert [r.status for r in piped.results] == [r.status for r in serial.results] == ["ok"] * 4 + ["failed"]
    assert [r.faces for r in piped.results] == [r.faces for r in serial.results] == [1, 1, 4, 0, 0]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in serial_out.iterdir())
    for r_s, r_p in zip(serial.results[:4], piped.results[:4], strict=True):
        a = cv2.imread(str(r_s.output)).astype(int)
        b = cv2.imread(str(r_p.output)).astype(int)
        assert a.shape == b.shape
        assert np.abs(a - b).max() <= TOLERANCE, r_s.path.name
    # the faces were really restored (not copied through)
    src = cv2.imread(str(mixed_folder / "a_astronaut.png")).astype(int)
    assert np.abs(cv2.imread(str(piped.results[0].output)).astype(int) - src).max() > 20
    assert "e_broken.jpg" in piped.results[4].error
    assert piped.stages["faces"] == 6
    assert set(piped.stages["batch_sizes"]) <= {1, 2, 4}


def test_results_in_input_order_and_named_as_serial(enhancer, tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    names = ["z_first.png", "a_second.jpg", "m_third.png", "b_fourth.png"]
    imgs = [samples.astronaut(), samples.grace_hopper(), np.full((64, 64, 3), 30, np.uint8), samples.astronaut()]
    paths = [_write(src / n, im) for n, im in zip(names, imgs, strict=True)]

    class SlowFirst(EnhancerStages):
        def prepare(self, index, path):
            if index == 0:
                time.sleep(1.0)             # the first input finishes last
            return super().prepare(index, path)

    out = tmp_path / "out"
    out.mkdir()
    stages = SlowFirst(enhancer, OutputNaming(out, suffix="_gpen"), paths)
    restorer = Restorer(enhancer.restore_fn, device="cpu", size=enhancer.size, max_batch=4)
    completion: list[int] = []
    summary = run_pipeline(paths, stages, restorer, RunnerConfig(workers=2, max_wait_ms=1.0),
                           on_result=lambda r: completion.append(r.index))
    assert completion[-1] == 0 and sorted(completion) == [0, 1, 2, 3]
    assert [r.index for r in summary.results] == [0, 1, 2, 3]
    assert [r.output.name for r in summary.results] == [
        "z_first_gpen.png", "a_second_gpen.jpg", "m_third_gpen.png", "b_fourth_gpen.png"]
    assert [r.faces for r in summary.results] == [1, 1, 0, 1]


# ---------------------------------------------------------------------------------------------------- robustness


def test_failures_are_isolated(enhancer, mixed_folder, tmp_path):
    # a real write failure: a folder sits where grace's output file must go
    (tmp_path / "b_grace.jpg").mkdir()
    summary = enhance_folder(mixed_folder, tmp_path, enhancer=enhancer, workers=2)
    status = {r.path.name: r.status for r in summary.results}
    assert status == {"a_astronaut.png": "ok", "b_grace.jpg": "failed", "c_mosaic.png": "ok",
                      "d_noface.png": "ok", "e_broken.jpg": "failed"}
    errors = {r.path.name: r.error for r in summary.results if r.error}
    assert "b_grace.jpg" in errors["b_grace.jpg"] and "e_broken.jpg" in errors["e_broken.jpg"]
    assert summary.ok == 3 and summary.failed == 2 and not summary.interrupted
    _no_partial_files(tmp_path)


def test_generator_failure_fails_only_that_batch(enhancer, tmp_path):
    """A non-OOM error in one generator call fails the images of that batch; later batches go on."""
    src = tmp_path / "in"
    src.mkdir()
    paths = [_write(src / f"{i}.png", samples.astronaut()) for i in range(4)]
    calls = {"n": 0}

    def flaky(x: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("cuDNN error: CUDNN_STATUS_EXECUTION_FAILED")
        return enhancer.restore_fn(x)

    out = tmp_path / "out"
    out.mkdir()
    stages = EnhancerStages(enhancer, OutputNaming(out), paths)
    restorer = Restorer(flaky, device="cpu", size=enhancer.size, max_batch=1)
    summary = run_pipeline(paths, stages, restorer, RunnerConfig(workers=1, max_batch=1))
    assert [r.status for r in summary.results] == ["failed", "ok", "ok", "ok"]
    assert "CUDNN_STATUS_EXECUTION_FAILED" in summary.results[0].error
    assert sorted(p.name for p in out.iterdir()) == ["1.png", "2.png", "3.png"]


def test_bounded_inflight_with_slow_consumer(enhancer, tmp_path):
    """With a slow paste/encode stage, no more than max_inflight images are ever held, and queues stay bounded."""
    src = tmp_path / "in"
    src.mkdir()
    face = cv2.resize(samples.astronaut(), (256, 256), interpolation=cv2.INTER_AREA)
    paths = [_write(src / f"img{i:02d}.png", face) for i in range(14)]
    lock = threading.Lock()
    live = {"now": 0, "peak": 0, "prepared": 0}

    class SlowConsumer(EnhancerStages):
        def prepare(self, index, path):
            item = super().prepare(index, path)
            with lock:
                live["now"] += 1
                live["prepared"] += 1
                live["peak"] = max(live["peak"], live["now"])
            return item

        def finish(self, item, restored, restored_device=None):
            time.sleep(0.15)
            out = super().finish(item, restored, restored_device)
            with lock:
                live["now"] -= 1
            return out

    out = tmp_path / "out"
    out.mkdir()
    stages = SlowConsumer(enhancer, OutputNaming(out), paths)
    restorer = Restorer(enhancer.restore_fn, device="cpu", size=enhancer.size, max_batch=2)
    cfg = RunnerConfig(workers=1, max_batch=2, max_inflight=3)
    summary = run_pipeline(paths, stages, restorer, cfg)
    assert summary.ok == 14
    assert live["peak"] <= 3                       # held images never exceed the bound
    assert live["peak"] >= 2                       # ... and the stages did overlap
    st = summary.stages
    assert st["peak_inflight"] <= 3
    for name, peak in st["queue_peaks"].items():
        assert peak <= st["queue_bounds"][name], name


def test_oom_splits_batch_and_keeps_the_limit():
    """An injected CUDA allocation failure above 2 faces: the batch is split, retried, and 2 is kept."""
    model = load_model("synthetic", model=GPENConfig(32, narrow=0.25))
    crops = list(samples.aligned_face_crops(32, 8))
    sizes: list[int] = []

    def small_gpu(x: torch.Tensor) -> torch.Tensor:
        sizes.append(x.shape[0])
        if x.shape[0] > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
        return model(x)

    restorer = Restorer(small_gpu, device="cpu", size=32, max_batch=8)
    got = restorer.submit(crops).result()
    assert sizes == [8, 4, 2, 2, 2, 2]              # 8 fails, 4 fails, then chunks of the kept limit
    assert restorer.limit == 2 and restorer.times.oom_splits == 2
    reference = Restorer(model, device="cpu", size=32, max_batch=2).restore_crops(crops)
    for a, b in zip(got, reference, strict=True):
        assert np.abs(a.astype(int) - b.astype(int)).max() <= 1
    sizes.clear()
    again = restorer.restore_crops(crops)                      # later work respects the kept limit: no new failure
    assert sizes == [2, 2, 2, 2] and restorer.times.oom_splits == 2
    assert len(again) == 8
    with pytest.raises(ValueError):                # a non-OOM error is not split, it propagates
        Restorer(lambda x: (_ for _ in ()).throw(ValueError("bad")), device="cpu", max_batch=4).submit(crops[:4])


def test_oom_limit_is_used_by_the_runner(enhancer, tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    paths = [_write(src / f"{i}.png", samples.mosaic(4, i)) for i in range(3)]

    def limited(x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")
        return enhancer.restore_fn(x)

    out = tmp_path / "out"
    out.mkdir()
    stages = EnhancerStages(enhancer, OutputNaming(out), paths)
    restorer = Restorer(limited, device="cpu", size=enhancer.size, max_batch=8)
    summary = run_pipeline(paths, stages, restorer, RunnerConfig(workers=1, max_batch=8, max_wait_ms=50))
    assert summary.ok == 3 and summary.faces == 12
    assert summary.stages["batch_limit"] == 2 and summary.stages["oom_splits"] >= 1
    # after the first split every submitted batch is at most the kept limit
    assert restorer.times.faces == 12


# ---------------------------------------------------------------------------------------------------- Ctrl-C


def _interrupt_paths(tmp_path: Path, n: int = 8) -> list[Path]:
    src = tmp_path / "in"
    src.mkdir()
    face = cv2.resize(samples.astronaut(), (192, 192), interpolation=cv2.INTER_AREA)
    return [_write(src / f"img{i}.png", face) for i in range(n)]


def test_interrupt_raised_inside_a_stage(enhancer, tmp_path):
    paths = _interrupt_paths(tmp_path)

    class InterruptAt4(EnhancerStages):
        def prepare(self, index, path):
            if index == 4:
                raise KeyboardInterrupt
            return super().prepare(index, path)

    out = tmp_path / "out"
    out.mkdir()
    before = threading.active_count()
    summary = run_pipeline(paths, InterruptAt4(enhancer, OutputNaming(out), paths),
                           Restorer(enhancer.restore_fn, device="cpu", size=enhancer.size, max_batch=2),
                           RunnerConfig(workers=1, max_batch=2))
    assert summary.interrupted
    assert len(summary.results) == 8 and summary.results[4].status == "dropped"
    assert summary.dropped >= 1 and "interrupted" in summary.line()
    written = _all_decodable(out)
    assert {p.name for p in written} == {r.output.name for r in summary.results if r.status == "ok"}
    _no_partial_files(out)
    assert threading.active_count() == before       # every runner thread has ended


def test_interrupt_while_writing_leaves_no_partial_file(enhancer, tmp_path, monkeypatch):
    import gpen_tune.imageio as imageio

    paths = _interrupt_paths(tmp_path, 6)
    real = imageio._write_8_bit
    count = {"n": 0}

    def write_then_interrupt(pic, tmp, fmt):
        count["n"] += 1
        if count["n"] == 3:
            Path(tmp).write_bytes(b"\x89PNG half a file")     # the encoder got part-way
            raise KeyboardInterrupt
        real(pic, tmp, fmt)

    monkeypatch.setattr(imageio, "_write_8_bit", write_then_interrupt)
    out = tmp_path / "out"
    summary = enhance_folder(paths, out, enhancer=enhancer, workers=1)
    assert summary.interrupted and summary.ok == 2 and summary.dropped == 4
    assert len(_all_decodable(out)) == 2
    _no_partial_files(out)


def test_ctrl_c_in_the_main_thread(enhancer, tmp_path):
    """SIGINT lands in the main thread, which is the one collecting results: simulate it there."""
    paths = _interrupt_paths(tmp_path)

    def ctrl_c(result):
        raise KeyboardInterrupt

    out = tmp_path / "out"
    summary = enhance_folder(paths, out, enhancer=enhancer, workers=2, on_result=ctrl_c)
    assert summary.interrupted and summary.ok >= 1 and summary.dropped >= 1
    assert summary.ok == len(_all_decodable(out))
    _no_partial_files(out)


def test_cli_sigint_prints_summary_and_exits_nonzero(tmp_path):
    """A real SIGINT to `gpen-tune enhance` with many inputs: summary printed, exit 130, no partial file."""
    src = tmp_path / "in"
    src.mkdir()
    for i in range(12):
        _write(src / f"m{i:02d}.png", samples.mosaic(4, i))
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "gpen_tune", "enhance", str(src), "-o", str(out), "--model", "GPEN-BFR-256",
           "--weights", "synthetic", "--device", "cpu", "--detector", "mtcnn", "--workers", "1",
           "--batch-size", "2"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if out.is_dir() and any(p.suffix == ".png" for p in out.iterdir()):
            break
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr and "faces restored" in stdout
    assert 1 <= len(_all_decodable(out)) < 12
    _no_partial_files(out)


# ---------------------------------------------------------------------------------------------------- GPU-side work


def test_device_paste_matches_cpu_paste():
    """The grid_sample paste (run here on the CPU device) against the face part's cv2 paste: <= 2 grey levels."""
    from gpen_tune.throughput.gpu_paste import DeviceFace, paste_faces_device

    from gpen_tune.face.align import alignment, warp_crop
    from gpen_tune.face.detect import init_detector
    from gpen_tune.face.paste import PasteFace, face_mask, paste_faces, soften

    image = samples.mosaic(6, 3)
    det = init_detector("mtcnn", device="cpu")
    try:
        (dets,) = det.detect([image])
    finally:
        det.close()
    assert len(dets) >= 5
    size = 128
    cpu_faces, dev_faces = [], []
    for d in dets:
        affine, inverse = alignment(d.landmarks, size, "gpen")
        restored = 255 - warp_crop(image, affine, size)         # a visibly different "restoration"
        small = min(d.box[2] - d.box[0], d.box[3] - d.box[1]) < 100
        cpu_faces.append(PasteFace(soften(restored) if small else restored, inverse, None))
        dev_faces.append(DeviceFace(torch.from_numpy(restored), inverse, face_mask(size), soften=small))
    for strength in (1.0, 0.6):
        want = paste_faces(image, cpu_faces, strength).astype(int)
        got = paste_faces_device(image, dev_faces, strength).astype(int)
        diff = np.abs(want - got)
        assert diff.max() <= TOLERANCE
        assert (diff > 0).mean() < 0.01
        assert np.abs(want - image).max() > 100                  # the faces did change the picture


_TRITON_PASTE = r"""
import json, sys
import cv2, numpy as np, torch
from gpen_tune.face import samples
from gpen_tune.face.align import alignment, warp_crop
from gpen_tune.face.detect import init_detector
from gpen_tune.face.paste import PasteFace, face_mask, paste_faces, soften
from gpen_tune.throughput import gpu_paste, paste_triton
from gpen_tune.throughput.gpu_paste import DeviceFace, paste_faces_device

full = samples.mosaic(4, 3)
det = init_detector("mtcnn", device="cpu")
(dets,) = det.detect([full])
k, size = 0.2, 24                       # small: the interpreter runs every program of the kernel in numpy
image = cv2.resize(full, None, fx=k, fy=k, interpolation=cv2.INTER_AREA)
cpu_faces, dev_faces = [], []
for i, d in enumerate(dets):
    for shift in (0.0, 2.5):            # a second, overlapping face per detection: the larger mask must win
        affine, inverse = alignment(d.landmarks * k + shift, size, "gpen")
        restored = 255 - warp_crop(image, affine, size)
        small = i == 0                  # one softened face (upstream's small-face rule) on the kernel path too
        cpu_faces.append(PasteFace(soften(restored) if small else restored, inverse, None))
        dev_faces.append(DeviceFace(torch.from_numpy(restored), inverse, face_mask(size), soften=small))
res = {"faces": len(dev_faces), "available": paste_triton.available(torch.device("cpu"))}
for case, pick in (("apart", slice(0, None, 2)), ("overlapping", slice(None))):
    for strength in (1.0, 0.6):
        want = paste_faces(image, cpu_faces[pick], strength).astype(int)
        got = paste_faces_device(image, dev_faces[pick], strength).astype(int)
        gpu_paste.USE_TRITON = False
        torch_path = paste_faces_device(image, dev_faces[pick], strength).astype(int)
        gpu_paste.USE_TRITON = True
        res[f"{case} {strength}"] = {
            "vs_cpu_max": int(np.abs(want - got).max()), "vs_torch_max": int(np.abs(torch_path - got).max()),
            "vs_cpu_over_2": float((np.abs(want - got).max(-1) > 2).mean()),
            "vs_torch_over_2": float((np.abs(torch_path - got).max(-1) > 2).mean()),
            "changed": int(np.abs(want - image).max())}
print("RESULT" + json.dumps(res))
"""


def test_triton_paste_matches_the_cpu_paste_in_interpreter():
    """The one-kernel GPU paste (Triton, run by its CPU interpreter) against the CPU paste and the PyTorch
    device paste: overlapping faces (the larger mask wins), a softened face, strength 1 and 0.6."""
    from triton_interp import run_in_interpreter

    res = run_in_interpreter(_TRITON_PASTE)
    assert res["available"] and res["faces"] >= 8, res
    for strength in ("1.0", "0.6"):
        apart, overlapping = res[f"apart {strength}"], res[f"overlapping {strength}"]
        assert apart["changed"] > 100 and overlapping["changed"] > 100, res   # the faces did change the picture
        assert apart["vs_cpu_max"] <= TOLERANCE and apart["vs_torch_max"] <= TOLERANCE, res
        # where two faces' masks are equal to float rounding, either may win (all three versions round sampling
        # positions differently): a few pixels on that curve; a wrong winner rule would change whole overlaps
        assert overlapping["vs_cpu_over_2"] < 0.002 and overlapping["vs_torch_over_2"] < 0.002, res


def test_uint8_conversion_is_the_serial_one(enhancer):
    crops = list(samples.aligned_face_crops(enhancer.size, 4))
    want = enhancer.restore_crops(crops)
    got = Restorer(enhancer.restore_fn, device="cpu", size=enhancer.size, max_batch=4).submit(crops).result()
    assert np.array_equal(np.stack(got), want)


@pytest.mark.gpu
def test_cuda_pinned_path_equals_serial_restore():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    model = load_model("synthetic", model=GPENConfig(64, narrow=0.25), device="cuda")
    enh = Enhancer(EnhanceSettings(device="cuda", detector="mtcnn"), model=model)
    crops = list(samples.aligned_face_crops(64, 8))
    want = enh.restore_crops(crops).astype(int)
    restorer = Restorer(enh.restore_fn, device="cuda", size=64, max_batch=8)
    first = restorer.submit(crops)
    second = restorer.submit(crops[4:])              # two batches in flight on the pinned double buffer
    # different batch sizes pick different cuDNN algorithms (and TF32 is on for fp32 convs by default): the
    # pinned path must match within the pipeline's tolerance, not bit for bit. The two batches hold different
    # faces, so a buffer handed to the wrong batch is far outside it.
    assert np.abs(want[:4] - want[4:]).max() > 10 * TOLERANCE
    assert np.abs(np.stack(first.result()).astype(int) - want).max() <= TOLERANCE
    assert np.abs(np.stack(second.result()).astype(int) - want[4:]).max() <= TOLERANCE
    assert restorer.times.generator_s > 0
    from gpen_tune.throughput.gpu_paste import DeviceFace, paste_faces_device

    image = samples.astronaut()
    face = DeviceFace(first.device_out[0], np.array([[2.0, 0, 100], [0, 2.0, 80]]),
                      np.ones((64, 64), np.float32))
    assert paste_faces_device(image, [face]).shape == image.shape


@pytest.mark.gpu
def test_cuda_triton_paste_matches_the_torch_paste():
    """On CUDA: the one-kernel paste against the PyTorch device paste and the CPU paste on a real mosaic with
    512-px crops (GPEN-512's), faces apart: within the pipeline's tolerance."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from gpen_tune.throughput import gpu_paste, paste_triton
    from gpen_tune.throughput.gpu_paste import DeviceFace, paste_faces_device

    from gpen_tune.face.align import alignment, warp_crop
    from gpen_tune.face.detect import init_detector
    from gpen_tune.face.paste import PasteFace, face_mask, paste_faces

    if not paste_triton.available(torch.device("cuda")):
        pytest.skip("needs Triton")
    image = cv2.resize(samples.mosaic(6, 3), None, fx=1.5, fy=1.5)
    det = init_detector("mtcnn", device="cuda")
    (dets,) = det.detect([image])
    det.close()
    assert len(dets) >= 5
    cpu_faces, dev_faces = [], []
    for d in dets:
        affine, inverse = alignment(d.landmarks, 512, "gpen")
        restored = 255 - warp_crop(image, affine, 512)
        cpu_faces.append(PasteFace(restored, inverse, None))
        dev_faces.append(DeviceFace(torch.from_numpy(restored).cuda(), inverse, face_mask(512)))
    for strength in (1.0, 0.6):
        got = paste_faces_device(image, dev_faces, strength).astype(int)
        gpu_paste.USE_TRITON = False
        try:
            torch_path = paste_faces_device(image, dev_faces, strength).astype(int)
        finally:
            gpu_paste.USE_TRITON = True
        want = paste_faces(image, cpu_faces, strength).astype(int)
        assert np.abs(got - torch_path).max() <= TOLERANCE
        assert np.abs(got - want).max() <= TOLERANCE and (got != want).mean() < 0.01
        assert np.abs(want - image).max() > 100


@pytest.mark.gpu
def test_cuda_deferred_nan_guard_recovers_the_batch_in_fp32():
    """On the GPU the runner reads the NaN guard's flag only when it collects a batch: a broken bf16 model's batch
    comes back as the fp32 model's crops, a healthy batch in flight next to it is untouched."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    import copy

    from gpen_tune.restore.convert import to_model_input, to_uint8_nhwc
    from gpen_tune.restore.restorer import build_restorer
    from gpen_tune.tune import TuneConfig

    model = load_model("synthetic", model=GPENConfig(64, narrow=0.25), device="cuda")
    crops = list(samples.aligned_face_crops(64, 4))
    x = to_model_input(torch.from_numpy(np.stack(crops)).cuda())
    with torch.no_grad():
        want_fp32 = to_uint8_nhwc(model(x)).cpu().numpy().astype(int)
    broken = build_restorer(copy.deepcopy(model), TuneConfig(amp="bf16"), device="cuda", max_batch=4)
    with torch.no_grad():
        broken.model.ecd0[0][0].weight.mul_(float("inf"))
    healthy = build_restorer(copy.deepcopy(model), TuneConfig(amp="bf16"), device="cuda", max_batch=4)
    bad, good = broken, healthy
    first, second = bad.submit(crops), good.submit(crops)
    assert np.abs(np.stack(first.result()).astype(int) - want_fp32).max() <= TOLERANCE
    assert broken.fp32_reruns == 1 and first.device_out is not None
    assert np.abs(np.stack(second.result()).astype(int) - want_fp32).max() <= 12   # bf16 vs fp32, finite
    assert healthy.fp32_reruns == 0


# ---------------------------------------------------------------------------------------------------- small parts


def test_bucket_sizes():
    assert split_sizes(29) == [16, 8, 4, 1]
    assert split_sizes(70) == [64, 4, 2]
    assert split_sizes(5, limit=2) == [2, 2, 1]
    assert bucket_floor(33) == 32 and bucket_floor(0) == 0 and bucket_floor(7, limit=3) == 2


def test_default_workers_follow_the_machine():
    assert default_workers(1) == 1 and default_workers(2) == 1
    assert default_workers(16) == 8 and default_workers(128) == 8
    assert RunnerConfig().resolved("cpu")[0] == default_workers()


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
    assert set(data["runs"]) == {"serial", "pipeline", "pipeline_detector_process"}
    proc = data["detector_process"]
    assert proc["images"] == 2 and proc["outputs_vs_pipeline"]["compared"] == 2
    assert proc["outputs_vs_pipeline"]["max_abs"] <= TOLERANCE
    for run in data["runs"].values():
        assert run["images_ok"] == 2 and run["faces"] == 2 and run["faces_per_s"] > 0
    assert data["folder"]["per_kind"] == {"copy": 2}
    assert data["outputs_vs_serial"]["compared"] == 2 and data["outputs_vs_serial"]["max_abs"] <= TOLERANCE
    assert "limiting" in data["runs"]["pipeline"]["stage_analysis"]


@pytest.mark.gpu
def test_cuda_folder_matches_serial_with_gpu_paste(mixed_folder, tmp_path):
    """On CUDA: pinned uploads, GPU conversion and GPU paste (forced) against the serial path, <= 2 grey levels."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    src = _copy_folder(mixed_folder, tmp_path / "in")
    _write(src / "f_big_mosaic.jpg", cv2.resize(samples.mosaic(6, 2), None, fx=2.0, fy=2.0))
    model = load_model("synthetic", model=GPENConfig(64, narrow=0.25), device="cuda")
    enh = Enhancer(EnhanceSettings(device="cuda", detector="mtcnn", batch_size=8), model=model)
    serial = enhance_folder(src, tmp_path / "s", enhancer=enh, serial=True, ext="png")
    piped = enhance_folder(src, tmp_path / "p", enhancer=enh, workers=2, paste="gpu", ext="png")
    assert [r.status for r in piped.results] == [r.status for r in serial.results]
    assert piped.faces == serial.faces >= 12
    for a, b in zip(serial.results, piped.results, strict=True):
        if a.output is not None:
            x, y = cv2.imread(str(a.output)).astype(int), cv2.imread(str(b.output)).astype(int)
            assert np.abs(x - y).max() <= TOLERANCE, a.path.name
    enh.close()


def test_one_shape_padding_and_its_take_policy(enhancer, tmp_path):
    """A one-shape Restorer (a compiled forward) pads to its limit and returns the rows asked for; its `take`
    then lets the runner launch any count up to the limit."""
    seen: list[int] = []

    def spy(x: torch.Tensor) -> torch.Tensor:
        seen.append(x.shape[0])
        return enhancer.restore_fn(x)

    crops = list(samples.aligned_face_crops(enhancer.size, 3))
    fixed = Restorer(spy, device="cpu", size=enhancer.size, max_batch=4, one_shape=True)
    got = fixed.submit(crops).result()
    want = Restorer(enhancer.restore_fn, device="cpu", size=enhancer.size, max_batch=4).submit(crops).result()
    assert seen == [4] and len(got) == 3
    assert max(np.abs(a.astype(int) - b.astype(int)).max() for a, b in zip(got, want, strict=True)) <= TOLERANCE

    src = tmp_path / "in"
    src.mkdir()
    paths = [_write(src / "m.png", samples.mosaic(3, 1))]
    stages = EnhancerStages(enhancer, OutputNaming(tmp_path), paths)
    restorer = Restorer(enhancer.restore_fn, device="cpu", size=enhancer.size, max_batch=4, one_shape=True)
    summary = run_pipeline(paths, stages, restorer, RunnerConfig(workers=1, max_batch=4))
    assert summary.faces == 3 and summary.stages["batch_sizes"] == {3: 1}    # 3 faces in one call, not 2 + 1


def test_lazy_detector_released_between_batches_is_thread_safe(tmp_path):
    """The tune part's LazyDetector with policy 'always' (released before every generator batch) under 2 prepare
    threads: a release never closes the detector while a thread is inside detect(), every image gets its faces,
    and the detector really was released and rebuilt."""
    from gpen_tune.face.detect import LazyDetector, init_detector

    lock = threading.Lock()
    state = {"busy": 0, "closed_while_busy": 0}

    class Watched:
        """The real MTCNN, noting whether it is closed while a detection is running."""

        def __init__(self):
            self.inner = init_detector("mtcnn", device="cpu")
            self.name, self.device = self.inner.name, self.inner.device

        def detect(self, images):
            with lock:
                state["busy"] += 1
            try:
                time.sleep(0.05)                      # widen the window a release could hit
                return self.inner.detect(images)
            finally:
                with lock:
                    state["busy"] -= 1

        def close(self):
            with lock:
                state["closed_while_busy"] += state["busy"] > 0
            self.inner.close()

    lazy = LazyDetector(Watched, policy="always", device="cpu")
    model = load_model("synthetic", model=GPENConfig(32, narrow=0.25))
    enh = Enhancer(EnhanceSettings(device="cpu", detector="mtcnn", batch_size=1), model=model, detector=lazy)
    src = tmp_path / "in"
    src.mkdir()
    face = cv2.resize(samples.astronaut(), (200, 200), interpolation=cv2.INTER_AREA)
    paths = [_write(src / f"{i}.png", face) for i in range(8)]
    summary = enhance_folder(paths, tmp_path / "out", enhancer=enh, workers=2, max_batch=1, max_wait_ms=0)
    assert summary.ok == 8 and summary.faces == 8
    assert lazy.releases >= 1 and lazy.builds >= 2
    assert state["closed_while_busy"] == 0
    enh.close()


# ---------------------------------------------------------------------------------------------------- detector server


class _GatedDetector:
    """The real MTCNN behind a gate: its first call waits until the test opens the gate, so the requests of the
    other threads are all queued by then (ordering by an Event, not by timing). Records each call's batch size."""

    def __init__(self):
        from face_testdata import mtcnn

        self.inner = mtcnn()
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.sizes: list[int] = []

    def detect(self, images):
        self.entered.set()
        self.gate.wait()
        self.sizes.append(len(images))
        if any(im.ndim != 3 for im in images):
            raise ValueError("detector input must be HWC RGB uint8")
        return self.inner.detect(images)


def test_detector_server_batches_waiting_callers_and_isolates_failures():
    from gpen_tune.face.detect import BatchingDetector

    photos = [samples.astronaut(), samples.grace_hopper(), samples.mosaic(4, 0), samples.astronaut()[::2, ::2].copy()]
    alone = [len(d) for d in _GatedDetector().inner.detect(photos)]
    gated = _GatedDetector()
    server = BatchingDetector(gated)
    got: dict[int, object] = {}

    def call(i, img):
        try:
            got[i] = server.detect([img])[0]
        except Exception as exc:
            got[i] = exc

    first = threading.Thread(target=call, args=(0, photos[0]))
    first.start()
    gated.entered.wait()                          # the server is inside its first call
    bad = np.zeros((8, 8), np.uint8)              # not an image: fails, but only for its caller
    others = [threading.Thread(target=call, args=(i, img)) for i, img in enumerate([*photos[1:], bad], start=1)]
    for t in others:
        t.start()
    while server._queue.qsize() < len(others):    # all queued behind the blocked first call
        time.sleep(0.01)
    gated.gate.set()
    for t in [first, *others]:
        t.join()
    server.close()
    assert gated.sizes[:2] == [1, 4]              # the second call took the four waiting requests at once
    assert (server.calls, server.images) == (4, 4) and server.busy_s > 0   # 1, then 3 retried alone (bad one failed)
    assert [len(got[i]) for i in range(4)] == alone and alone[:3] == [1, 1, 4]
    assert isinstance(got[4], ValueError)
    with pytest.raises(RuntimeError, match="closed"):
        server.detect([photos[0]])


def test_prepare_threads_default_to_six_per_finish_thread_on_cuda():
    """On CUDA the prepare threads mostly wait for the one detector thread: more of them, bigger detector batches;
    the in-flight bound grows with them so every thread can hold an image."""
    workers, prepare, batch, inflight = RunnerConfig(workers=8).resolved("cuda")
    assert (workers, prepare, batch) == (8, 48, 32) and inflight >= 2 * (prepare + workers)
    assert RunnerConfig(workers=4).resolved("cuda")[1] == 24
    assert RunnerConfig(workers=16).resolved("cuda")[1] == 48                       # capped
    assert RunnerConfig(workers=3).resolved("cpu")[1] == 3                          # CPU: one per finish thread
    assert RunnerConfig(workers=8, prepare_workers=5).resolved("cuda")[1] == 5      # explicit wins


def test_detector_server_shrinks_in_the_callers_thread_with_identical_detections():
    from face_testdata import mtcnn

    from gpen_tune.face.detect import BatchingDetector

    inner = mtcnn()
    big = cv2.resize(samples.mosaic(4, 0), None, fx=1.6, fy=1.6, interpolation=cv2.INTER_CUBIC)
    assert max(big.shape[:2]) > inner.det_size                     # the shrink matters for this one
    photos = [big, samples.astronaut()]
    want = inner.detect(photos)
    server = BatchingDetector(inner)
    try:
        got = server.detect(photos)
    finally:
        server._queue.put(None)                                    # stop the thread, keep the shared detector
    assert [len(g) for g in got] == [len(w) for w in want] == [4, 1]
    for g_img, w_img in zip(got, want, strict=True):
        for g, w in zip(g_img, w_img, strict=True):
            assert np.array_equal(g.box, w.box) and np.array_equal(g.landmarks, w.landmarks) and g.score == w.score


def test_device_soften_of_a_batch_equals_each_face_alone_and_the_cpu_filter():
    """The GPU paste softens a batch of small faces in one go: each face gets exactly what it gets alone, and what
    the CPU path's filter gives (the weights are multiples of 1/16: exact sums), on real face crops."""
    from gpen_tune.throughput.gpu_paste import _soften

    from gpen_tune.face.paste import soften

    faces = [cv2.resize(samples.astronaut()[30:250, 140:360], (48, 48), interpolation=cv2.INTER_AREA),
             cv2.resize(samples.grace_hopper()[40:340, 100:400], (48, 48), interpolation=cv2.INTER_AREA)]
    batch = _soften(torch.from_numpy(np.stack(faces))).numpy()
    for face, got in zip(faces, batch, strict=True):
        assert np.array_equal(got, _soften(torch.from_numpy(face)).numpy())
        assert np.array_equal(got, soften(face))
        assert not np.array_equal(got, face)


@pytest.mark.gpu
def test_cuda_faces_cut_on_the_gpu(mixed_folder, tmp_path):
    """On CUDA with the GPU paste, prepare cuts the faces on the GPU: the same bits as the CPU crop, the image kept
    on the device for the paste, and no host copy of the restored crops needed."""
    from gpen_tune.face.align import warp_crop

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    model = load_model("synthetic", model=GPENConfig(64, narrow=0.25), device="cuda")
    enh = Enhancer(EnhanceSettings(device="cuda", detector="mtcnn", batch_size=8), model=model)
    paths = sorted(Path(mixed_folder).iterdir())
    stages = EnhancerStages(enh, OutputNaming(tmp_path), paths, paste="gpu")
    if not stages.cut_on_device:
        pytest.skip("needs Triton")
    items = [stages.prepare(i, p) for i, p in enumerate(paths) if p.name != "e_broken.jpg"]
    with_faces = [it for it in items if it.job.faces]
    assert len(with_faces) >= 2
    for it in with_faces:
        got = torch.stack(list(stages.crops(it))).cpu().numpy()
        want = np.stack([warp_crop(it.job.picture.rgb8(), f.affine, enh.size) for f in it.job.faces])
        np.testing.assert_array_equal(got, want)
        assert it.image_device is not None and not stages.needs_host_restored(it)
    stages.save_faces = True
    assert stages.needs_host_restored(with_faces[0])
    again = stages.prepare(with_faces[0].index, paths[with_faces[0].index])
    assert again.image_device is None and all(f.crop is not None for f in again.job.faces)   # --save-faces: host crops
    enh.close()
