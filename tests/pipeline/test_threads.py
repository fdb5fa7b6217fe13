"""The threaded scheduler (gpen_tune.pipeline.threads.run_threaded) against the serial path, on real photos, on
the CPU: parity, order, failures per image, bounded memory, Ctrl-C, the lazy detector; and on CUDA the device
crop and paste.

A tiny synthetic GPEN (64 px, narrow 0.25) keeps the generator cheap; detection is the real offline MTCNN.
Stated tolerance: threaded outputs equal the serial outputs within 2 grey levels per pixel (the only difference
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

from gpen_tune.face import samples
from gpen_tune.load import load_model
from gpen_tune.model.configs import GPENConfig
from gpen_tune.pipeline import EnhanceSettings, FileSink, FileSource, OutputNaming, Pipeline, SchedulerConfig, enhance
from gpen_tune.pipeline.scheduler import few_cpu_cores, serial_by_default
from gpen_tune.pipeline.steps import Steps
from gpen_tune.pipeline.threads import run_threaded
from gpen_tune.restore.restorer import Restorer
from gpen_tune.tune import TuneConfig

TOLERANCE = 2          # grey levels, threaded vs serial output
STATUSES = ["ok", "ok", "ok", "no_face", "error"]   # the mixed folder
ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------------- fixtures


def _write(path: Path, rgb: np.ndarray) -> Path:
    cv2.imwrite(str(path), np.ascontiguousarray(rgb[..., ::-1]))
    return path


@pytest.fixture(scope="module")
def model():
    return load_model("synthetic", model=GPENConfig(64, narrow=0.25))


@pytest.fixture(scope="module")
def pipe(model):
    p = Pipeline(EnhanceSettings(device="cpu", detector="mtcnn", batch_size=4), model=model)
    yield p
    p.close()


def threaded(pipe: Pipeline, paths, out: Path, restorer=None, steps_cls=Steps, naming=None,
             config: SchedulerConfig = SchedulerConfig(workers=2), on_result=None):
    """`paths` through run_threaded with `pipe`'s detector thread, a FileSink into `out` and `restorer`."""
    sink = FileSink(naming or OutputNaming(out))
    steps = steps_cls(pipe.settings, restorer or pipe.restorer, sink, detector=pipe.detector("thread"))
    return run_threaded(FileSource(paths), steps, config, on_result=on_result)


def _name(job) -> str:
    return Path(job.source).name


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
def serial_run(pipe, mixed_folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("serial")       # PNG: the comparison sees the pixels, not JPEG's rounding of them
    return out, enhance(mixed_folder, out, pipeline=pipe, serial=True, ext="png").summary


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


def test_pipeline_matches_serial_on_mixed_folder(pipe, mixed_folder, serial_run, tmp_path):
    serial_out, serial = serial_run
    # detect_batch=3: a prepare worker decodes and detects up to 3 images per call (the broken file inside a group)
    piped = enhance(mixed_folder, tmp_path, pipeline=pipe, serial=False, ext="png",
                    config=SchedulerConfig(workers=2, detect_batch=3)).summary
    assert [_name(r) for r in piped.results] == [_name(r) for r in serial.results]
    assert [r.status for r in piped.results] == [r.status for r in serial.results] == STATUSES
    assert [len(r.faces) for r in piped.results] == [len(r.faces) for r in serial.results] == [1, 1, 4, 0, 0]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in serial_out.iterdir())
    for r_s, r_p in zip(serial.results[:4], piped.results[:4], strict=True):
        a = cv2.imread(str(r_s.output)).astype(int)
        b = cv2.imread(str(r_p.output)).astype(int)
        assert a.shape == b.shape
        assert np.abs(a - b).max() <= TOLERANCE, _name(r_s)
    # the faces were really restored (not copied through)
    src = cv2.imread(str(mixed_folder / "a_astronaut.png")).astype(int)
    assert np.abs(cv2.imread(str(piped.results[0].output)).astype(int) - src).max() > 20
    assert "e_broken.jpg" in piped.results[4].error
    assert piped.faces == 6
    assert set(piped.stages["batch_sizes"]) <= {1, 2, 4}


def test_results_in_input_order_and_named_as_serial(pipe, tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    names = ["z_first.png", "a_second.jpg", "m_third.png", "b_fourth.png"]
    imgs = [samples.astronaut(), samples.grace_hopper(), np.full((64, 64, 3), 30, np.uint8), samples.astronaut()]
    paths = [_write(src / n, im) for n, im in zip(names, imgs, strict=True)]

    class SlowFirst(Steps):
        def prepare(self, jobs):
            if any(j.index == 0 for j in jobs):
                time.sleep(1.0)             # the first input finishes last
            return super().prepare(jobs)

    out = tmp_path / "out"
    completion: list[int] = []
    summary = threaded(pipe, paths, out, steps_cls=SlowFirst, naming=OutputNaming(out, suffix="_gpen"),
                       config=SchedulerConfig(workers=2, max_wait_ms=1.0),
                       on_result=lambda r: completion.append(r.index))
    assert completion[-1] == 0 and sorted(completion) == [0, 1, 2, 3]
    assert [r.index for r in summary.results] == [0, 1, 2, 3]
    assert [r.output.name for r in summary.results] == [
        "z_first_gpen.png", "a_second_gpen.jpg", "m_third_gpen.png", "b_fourth_gpen.png"]
    assert [len(r.faces) for r in summary.results] == [1, 1, 0, 1]


# ---------------------------------------------------------------------------------------------------- robustness


def test_failures_are_isolated(pipe, mixed_folder, tmp_path):
    # a real write failure: a folder sits where grace's output file must go
    (tmp_path / "b_grace.jpg").mkdir()
    summary = enhance(mixed_folder, tmp_path, pipeline=pipe, serial=False, existing="overwrite",
                      config=SchedulerConfig(workers=2)).summary
    status = {_name(r): r.status for r in summary.results}
    assert status == {"a_astronaut.png": "ok", "b_grace.jpg": "error", "c_mosaic.png": "ok",
                      "d_noface.png": "no_face", "e_broken.jpg": "error"}
    errors = {_name(r): r.error for r in summary.results if r.error}
    assert "b_grace.jpg" in errors["b_grace.jpg"] and "e_broken.jpg" in errors["e_broken.jpg"]
    assert summary.ok == 3 and summary.failed == 2 and not summary.interrupted
    _no_partial_files(tmp_path)


def test_generator_failure_fails_only_that_batch(pipe, model, tmp_path):
    """A non-OOM error in one generator call fails the images of that batch; later batches go on."""
    src = tmp_path / "in"
    src.mkdir()
    paths = [_write(src / f"{i}.png", samples.astronaut()) for i in range(4)]
    calls = {"n": 0}

    def flaky(x: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("cuDNN error: CUDNN_STATUS_EXECUTION_FAILED")
        return model(x)

    out = tmp_path / "out"
    restorer = Restorer(flaky, device="cpu", size=64, max_batch=1)
    summary = threaded(pipe, paths, out, restorer, config=SchedulerConfig(workers=1))
    assert [r.status for r in summary.results] == ["error", "ok", "ok", "ok"]
    assert "CUDNN_STATUS_EXECUTION_FAILED" in summary.results[0].error
    assert sorted(p.name for p in out.iterdir()) == ["1.png", "2.png", "3.png"]


def test_bounded_inflight_with_slow_consumer(pipe, model, tmp_path):
    """With a slow paste/encode stage, no more than max_inflight images are ever held, and queues stay bounded."""
    src = tmp_path / "in"
    src.mkdir()
    face = cv2.resize(samples.astronaut(), (256, 256), interpolation=cv2.INTER_AREA)
    paths = [_write(src / f"img{i:02d}.png", face) for i in range(14)]
    lock = threading.Lock()
    live = {"now": 0, "peak": 0, "prepared": 0}

    class SlowConsumer(Steps):
        def prepare(self, jobs):
            done = super().prepare(jobs)
            with lock:
                live["now"] += len(jobs)
                live["prepared"] += len(jobs)
                live["peak"] = max(live["peak"], live["now"])
            return done

        def finish(self, job):
            time.sleep(0.15)
            super().finish(job)
            with lock:
                live["now"] -= 1

    restorer = Restorer(model, device="cpu", size=64, max_batch=2)
    cfg = SchedulerConfig(workers=1, prepare_workers=1, max_inflight=3)
    summary = threaded(pipe, paths, tmp_path / "out", restorer, steps_cls=SlowConsumer, config=cfg)
    assert summary.ok == 14
    assert live["peak"] <= 3                       # held images never exceed the bound
    assert live["peak"] >= 2                       # ... and the stages did overlap
    st = summary.stages
    assert st["peak_inflight"] <= 3
    for name, peak in st["queue_peaks"].items():
        assert peak <= st["queue_bounds"][name], name


def test_oom_limit_is_used_by_the_scheduler(pipe, model, tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    paths = [_write(src / f"{i}.png", samples.mosaic(4, i)) for i in range(3)]

    def limited(x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")
        return model(x)

    restorer = Restorer(limited, device="cpu", size=64, max_batch=8)
    summary = threaded(pipe, paths, tmp_path / "out", restorer, config=SchedulerConfig(workers=1, max_wait_ms=50))
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


def test_interrupt_raised_inside_a_stage(pipe, model, tmp_path):
    paths = _interrupt_paths(tmp_path)

    class InterruptAt4(Steps):
        def prepare(self, jobs):
            if any(j.index == 4 for j in jobs):
                raise KeyboardInterrupt
            return super().prepare(jobs)

    out = tmp_path / "out"
    summary = threaded(pipe, paths, out, Restorer(model, device="cpu", size=64, max_batch=2),
                       steps_cls=InterruptAt4, config=SchedulerConfig(workers=1))
    assert summary.interrupted
    assert len(summary.results) == 8 and summary.results[4].status == "dropped"
    assert summary.dropped >= 1 and "interrupted" in summary.line()
    # the output folder is made by the first write; preparing runs ahead of restoring, so under load image 4 can
    # raise before image 0 is written, and then no folder exists
    written = _all_decodable(out) if out.exists() else []
    assert {p.name for p in written} == {r.output.name for r in summary.results if r.status == "ok"}
    _no_partial_files(out)
    scheduler = ("gpen-feed", "gpen-prep", "gpen-gpu", "gpen-fin")
    assert not [t.name for t in threading.enumerate() if t.name.startswith(scheduler)]   # every one has ended


def test_interrupt_while_writing_leaves_no_partial_file(pipe, tmp_path, monkeypatch):
    import gpen_tune.imageio as imageio

    paths = _interrupt_paths(tmp_path, 6)
    real = imageio._write_png
    count = {"n": 0}

    def write_then_interrupt(pic, tmp, level):
        count["n"] += 1
        if count["n"] == 3:
            Path(tmp).write_bytes(b"\x89PNG half a file")     # the encoder got part-way
            raise KeyboardInterrupt
        real(pic, tmp, level)

    monkeypatch.setattr(imageio, "_write_png", write_then_interrupt)
    out = tmp_path / "out"
    summary = enhance(paths, out, pipeline=pipe, config=SchedulerConfig(workers=1)).summary
    assert summary.interrupted and summary.ok == 2 and summary.dropped == 4
    assert len(_all_decodable(out)) == 2
    _no_partial_files(out)


def test_ctrl_c_in_the_main_thread(pipe, tmp_path):
    """SIGINT lands in the main thread, which is the one collecting results: simulate it there."""
    paths = _interrupt_paths(tmp_path)

    def ctrl_c(result):
        raise KeyboardInterrupt

    out = tmp_path / "out"
    summary = enhance(paths, out, pipeline=pipe, config=SchedulerConfig(workers=2), on_result=ctrl_c).summary
    assert summary.interrupted and summary.ok >= 1 and summary.dropped >= 1
    assert summary.ok == len(_all_decodable(out))
    _no_partial_files(out)


@pytest.mark.slow
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


def test_one_shape_restorer_takes_any_count_in_one_call(pipe, model, tmp_path):
    """A one-shape Restorer (a compiled forward): the scheduler launches the 3 faces of an image as one call."""
    src = tmp_path / "in"
    src.mkdir()
    paths = [_write(src / "m.png", samples.mosaic(3, 1))]
    restorer = Restorer(model, device="cpu", size=64, max_batch=4, one_shape=True)
    summary = threaded(pipe, paths, tmp_path / "out", restorer, config=SchedulerConfig(workers=1))
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
    enh = Pipeline(EnhanceSettings(device="cpu", detector="mtcnn", batch_size=1), TuneConfig(lazy_detector=True),
                   model=model, detector=lazy)
    src = tmp_path / "in"
    src.mkdir()
    face = cv2.resize(samples.astronaut(), (200, 200), interpolation=cv2.INTER_AREA)
    paths = [_write(src / f"{i}.png", face) for i in range(8)]
    summary = enhance(paths, tmp_path / "out", pipeline=enh,
                      config=SchedulerConfig(workers=2, prepare_workers=2, max_wait_ms=0)).summary
    assert summary.ok == 8 and summary.faces == 8
    assert lazy.releases >= 1 and lazy.builds >= 2
    assert state["closed_while_busy"] == 0
    enh.close()


@pytest.mark.gpu
def test_cuda_folder_matches_serial_with_gpu_paste(mixed_folder, tmp_path, no_tf32):
    """On CUDA: pinned uploads, GPU conversion and GPU paste (forced) against the serial path, <= 2 grey levels
    (in full fp32: the two paths batch the faces differently)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    src = _copy_folder(mixed_folder, tmp_path / "in")
    _write(src / "f_big_mosaic.jpg", cv2.resize(samples.mosaic(6, 2), None, fx=2.0, fy=2.0))
    model = load_model("synthetic", model=GPENConfig(64, narrow=0.25), device="cuda")
    host = Pipeline(EnhanceSettings(device="cuda", detector="mtcnn", batch_size=8), model=model)
    device = Pipeline(EnhanceSettings(device="cuda", detector="mtcnn", batch_size=8, paste="gpu"), model=model)
    serial = enhance(src, tmp_path / "s", pipeline=host, serial=True, ext="png").summary
    piped = enhance(src, tmp_path / "p", pipeline=device, config=SchedulerConfig(workers=2), ext="png").summary
    assert [r.status for r in piped.results] == [r.status for r in serial.results]
    assert piped.faces == serial.faces >= 12
    for a, b in zip(serial.results, piped.results, strict=True):
        if a.output is not None:
            x, y = cv2.imread(str(a.output)).astype(int), cv2.imread(str(b.output)).astype(int)
            assert np.abs(x - y).max() <= TOLERANCE, _name(a)
    host.close()
    device.close()


@pytest.mark.gpu
def test_cuda_faces_cut_on_the_gpu(mixed_folder, tmp_path):
    """On CUDA with the GPU paste, prepare cuts the faces on the GPU: the same bits as the CPU crop, the image kept
    on the device for the paste, and no host copy of the restored crops needed."""
    from gpen_tune.face.align import warp_crop

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    model = load_model("synthetic", model=GPENConfig(64, narrow=0.25), device="cuda")
    from gpen_tune.pipeline.job import ImageJob

    enh = Pipeline(EnhanceSettings(device="cuda", detector="mtcnn", batch_size=8, paste="gpu"), model=model)
    paths = [p for p in sorted(Path(mixed_folder).iterdir()) if p.name != "e_broken.jpg"]
    steps = enh.steps()
    if not steps.cut_on_device:
        pytest.skip("needs Triton")
    jobs = steps.prepare([ImageJob(str(p), i, load=lambda p=p: str(p)) for i, p in enumerate(paths)])
    with_faces = [job for job in jobs if job.faces]
    assert len(with_faces) >= 2
    for job in with_faces:
        got = torch.stack([f.crop for f in job.faces]).cpu().numpy()
        want = np.stack([warp_crop(job.picture.rgb8(), f.affine, enh.size) for f in job.faces])
        np.testing.assert_array_equal(got, want)
        assert job.on_device and job.image_device is not None      # the restorations need no host copy
    saving = enh.steps(save_faces=True)               # --save-faces: the crops are cut on the host
    first = paths[with_faces[0].index]
    again = saving.prepare([ImageJob(str(first), 0, load=lambda: str(first))])[0]
    assert not saving.cut_on_device and again.image_device is None
    assert again.faces and all(isinstance(f.crop, np.ndarray) for f in again.faces)
    enh.close()


# -- which path a run takes when the caller does not say ------------------------------------------------------------

@pytest.mark.parametrize("photos, device, config, cores, serial", [
    (1, "cuda", None, 64, True),                          # one image: nothing to overlap
    (3, "cuda", None, 2, False),
    (3, "cpu", None, 2, True),                            # a 2-core CPU: the split of the cores costs more
    (3, "cpu", None, 1, True),
    (3, "cpu", None, 4, False),
    (3, "cpu", SchedulerConfig(workers=1), 2, False),     # thread counts given: the threads
    (3, "cpu", SchedulerConfig(torch_threads=1), 2, False),
    (1, "cpu", SchedulerConfig(workers=2), 8, True),
], ids=["one-photo", "cuda-many-photos", "cpu-2-cores", "cpu-1-core", "cpu-4-cores", "cpu-workers", "cpu-torch-threads",
        "one-photo-workers"])
def test_serial_by_default(photos, device, config, cores, serial):
    assert serial_by_default(photos, device, config, cores=cores) is serial
    if photos > 1:                                        # a video's frames follow the many-photos rule
        assert few_cpu_cores(device, config, cores=cores) is serial


def test_a_folder_takes_the_path_the_rule_names(pipe, mixed_folder, tmp_path):
    """`enhance` without `serial`: on this machine's cores the rule's path, with the same pixels as `--serial`'s
    and the threads' when asked for (serial=False)."""
    want = "serial" if serial_by_default(5, "cpu") else "threaded"
    default = enhance(mixed_folder, tmp_path / "d", pipeline=pipe, ext="png").summary
    piped = enhance(mixed_folder, tmp_path / "p", pipeline=pipe, serial=False, ext="png").summary
    assert default.stages["mode"] == want and piped.stages["mode"] == "threaded"
    assert default.ok == piped.ok == 4 and default.failed == piped.failed == 1
