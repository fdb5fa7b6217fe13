"""The detector's services from the one factory (gpen_tune.face.detect.init_detector: inline, thread, process) and
the opt-in detector process (gpen_tune.face.detect.process) against the in-process detector, on the CPU.

Real photos and the real offline MTCNN in a real spawned process (one shared by most tests: spawning costs
seconds). Detections must be identical to the in-process detector's: every photo here has a size of its own, so
no two share a CPU forward pass (same-size images are stacked, which changes float results by an ULP).
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from face_testdata import mtcnn

from gpen_tune.face import samples
from gpen_tune.face.detect import (
    BatchingDetector,
    DetectorError,
    DetectorSpec,
    LazyDetector,
    MTCNNDetector,
    ProcessDetector,
    init_detector,
)
from gpen_tune.load import load_model
from gpen_tune.model.configs import GPENConfig
from gpen_tune.pipeline import EnhanceSettings, Pipeline, SchedulerConfig, enhance
from gpen_tune.restore import as_restorer

pytestmark = pytest.mark.slow   # real spawned detector processes

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = 2          # grey levels: faces may share other generator batches in two pipelined runs


@pytest.fixture(scope="module")
def proc():
    det = init_detector("mtcnn", device="cpu", service="process")
    assert isinstance(det, ProcessDetector) and det.spec.torch_threads == torch.get_num_threads()
    yield det
    det.close()


@pytest.fixture(scope="module")
def photos() -> list[np.ndarray]:
    """Six real photos, each of a size of its own; one larger than det_size (the caller's shrink matters)."""
    big = cv2.resize(samples.mosaic(4, 0), None, fx=1.6, fy=1.6, interpolation=cv2.INTER_CUBIC)
    imgs = [samples.astronaut(), samples.grace_hopper(), samples.mosaic(4, 0), big,
            cv2.resize(samples.astronaut(), (384, 384), interpolation=cv2.INTER_AREA),
            cv2.resize(samples.grace_hopper(), (384, 450), interpolation=cv2.INTER_AREA)]
    assert len({im.shape for im in imgs}) == len(imgs) and max(big.shape[:2]) > mtcnn().det_size
    return imgs


@pytest.fixture(scope="module")
def reference(photos) -> list[list]:
    """The in-process detector, one photo per call."""
    return [mtcnn().detect([img])[0] for img in photos]


def _assert_same(got: list, want: list) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert np.array_equal(g.box, w.box) and np.array_equal(g.landmarks, w.landmarks) and g.score == w.score


def _reset(det: ProcessDetector) -> None:
    det.calls = det.images = det.largest = 0


# ---------------------------------------------------------------------------------------------------- parity


def test_same_detections_as_in_process(proc, photos, reference):
    got = proc.detect(photos)
    assert [len(d) for d in got] == [len(d) for d in reference] == [1, 1, 4, 4, 1, 1]
    for g, w in zip(got, reference, strict=True):
        _assert_same(g, w)
    assert (proc.name, proc.device.type, proc.det_size) == ("mtcnn", "cpu", mtcnn().det_size)
    assert proc.detect([]) == []


def test_factory_services_give_identical_detections(proc, photos, reference):
    """inline, thread and process from the one factory: the same detections on the bundled photos, the same
    interface (name, device, before_restore, close)."""
    inline = init_detector("mtcnn", device="cpu", service="inline")
    thread = init_detector("mtcnn", device="cpu", service="thread")
    assert isinstance(inline, MTCNNDetector) and isinstance(thread, BatchingDetector)
    try:
        for det in (inline, thread, proc):
            assert (det.name, det.device) == ("mtcnn", torch.device("cpu"))
            det.before_restore()
            found = [det.detect([img])[0] for img in photos]
            for g, w in zip(found, reference, strict=True):
                _assert_same(g, w)
    finally:
        inline.close()
        thread.close()
    with pytest.raises(RuntimeError, match="closed"):
        thread.detect([photos[0]])


def test_factory_lazy_services(photos, reference):
    """lazy=True: built on first use, released by before_restore (policy "always"), the same detections; behind
    the thread service too. With service "process" it is refused in one line, before anything is built."""
    lazy = init_detector("mtcnn", device="cpu", lazy=True, lazy_policy="always")
    assert isinstance(lazy, LazyDetector) and not lazy.loaded
    _assert_same(lazy.detect([photos[0]])[0], reference[0])
    lazy.before_restore()
    assert not lazy.loaded and lazy.releases == 1
    served = init_detector("mtcnn", device="cpu", service="thread", lazy=True, lazy_policy="always")
    try:
        _assert_same(served.detect([photos[1]])[0], reference[1])
        served.before_restore()
        _assert_same(served.detect([photos[2]])[0], reference[2])
    finally:
        served.close()
    with pytest.raises(ValueError, match="lazy detector") as err:
        init_detector("mtcnn", device="cpu", service="process", lazy=True)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="service must be one of"):
        init_detector("mtcnn", service="pool")


def test_concurrent_callers_get_their_own_detections(proc, photos, reference):
    _reset(proc)
    rounds = 3
    got: dict[tuple[int, int], list] = {}
    start = threading.Barrier(len(photos))

    def caller(i: int) -> None:
        start.wait()
        for k in range(rounds):
            (got[i, k],) = proc.detect([photos[i]])

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(len(photos))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for (i, _), dets in got.items():
        _assert_same(dets, reference[i])
    assert len(got) == rounds * len(photos) == proc.images
    assert proc.calls < proc.images and proc.largest >= 2     # callers that waited shared a detector call


def test_several_processes_share_the_callers_batches(photos, reference):
    """processes=2: two children fed from one queue; while one detects the large photo the other takes the next
    callers' batches; every caller gets its own detections, identical to the in-process detector's; close ends
    both children."""
    pool = init_detector("mtcnn", device="cpu", service="process", processes=2)
    try:
        assert isinstance(pool, ProcessDetector) and len(pool.children_processes) == 2
        assert len({p.pid for p in pool.children_processes}) == 2
        got: dict[int, list] = {}

        def caller(i: int) -> None:
            (got[i],) = pool.detect([photos[i]])

        first = threading.Thread(target=caller, args=(3,))        # the large one keeps one child busy
        first.start()
        time.sleep(0.05)
        others = [threading.Thread(target=caller, args=(i,)) for i in (0, 1, 2, 4, 5)]
        for t in others:
            t.start()
        for t in [first, *others]:
            t.join()
        for i, dets in got.items():
            _assert_same(dets, reference[i])
        assert len(got) == len(photos) == pool.images
        assert all(n >= 1 for n in pool.calls_by_process) and sum(pool.calls_by_process) == pool.calls
    finally:
        pool.close()
    assert not any(p.is_alive() for p in pool.children_processes)
    with pytest.raises(ValueError, match="processes must be >= 1"):
        ProcessDetector(DetectorSpec("mtcnn"), processes=0)


# ---------------------------------------------------------------------------------------------------- failures


def test_bad_input_fails_only_its_caller(proc, photos, reference):
    with pytest.raises(ValueError, match="HWC RGB uint8"):               # the caller's shrink refuses it
        proc.detect([np.zeros((8, 8), np.uint8)])
    with pytest.raises(ValueError, match="uint8"):
        proc.detect([photos[0].astype(np.float32)])
    # without the caller's shrink the child's detector judges the shape: its batch fails, is retried request
    # by request, and only the bad caller gets the error
    proc.shrink_in_caller = False
    _reset(proc)
    got: dict[int, object] = {}

    def caller(i: int, img: np.ndarray) -> None:
        try:
            got[i] = proc.detect([img])[0]
        except Exception as exc:  # noqa: BLE001 - recorded for the asserts
            got[i] = exc

    try:
        first = threading.Thread(target=caller, args=(3, photos[3]))   # the large one keeps the child busy
        first.start()
        time.sleep(0.05)                 # its detection takes several times longer than the others need to queue
        jobs = [(0, photos[0]), (1, photos[1]), (9, np.zeros((8, 8), np.uint8)), (2, photos[2])]
        others = [threading.Thread(target=caller, args=job) for job in jobs]
        for t in others:
            t.start()
        for t in [first, *others]:
            t.join()
    finally:
        proc.shrink_in_caller = True
    assert isinstance(got[9], ValueError) and "HWC RGB uint8" in str(got[9])
    for i in (0, 1, 2, 3):
        _assert_same(got[i], reference[i])
    assert proc.largest >= 2                                           # the bad image shared a batch
    _assert_same(proc.detect([photos[4]])[0], reference[4])           # and the detector still works


def test_start_failure_comes_back_with_its_message(proc):
    with pytest.raises(DetectorError, match="unknown detector 'nope'"):
        ProcessDetector(DetectorSpec("nope"))
    alive = [p.pid for p in multiprocessing.active_children() if p.name == "gpen-detect-process"]
    assert alive == [proc.process.pid]                       # the failed one is gone


def test_lazy_detector_is_refused(tmp_path):
    lazy = LazyDetector(lambda: mtcnn(), policy="always", device="cpu")
    settings = EnhanceSettings(device="cpu", detector="mtcnn", detector_process=True)
    pipe = Pipeline(settings, restorer=as_restorer(lambda x: x, device="cpu", size=64), detector=lazy)
    with pytest.raises(ValueError, match="lazy detector"):
        pipe.steps(service="process")
    assert pipe.detector("inline") is lazy and lazy.builds == 0


# ---------------------------------------------------------------------------------------------------- folder run


def _write(path: Path, rgb: np.ndarray) -> None:
    cv2.imwrite(str(path), np.ascontiguousarray(rgb[..., ::-1]))


def test_folder_run_matches_the_default_pipeline(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    _write(src / "a_astronaut.png", samples.astronaut())
    _write(src / "b_grace.jpg", samples.grace_hopper())
    _write(src / "c_mosaic.png", samples.mosaic(4, 0))
    _write(src / "d_noface.png", np.full((96, 128, 3), 90, np.uint8))
    (src / "e_broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    model = load_model("synthetic", model=GPENConfig(64, narrow=0.25))
    settings = EnhanceSettings(device="cpu", detector="mtcnn", batch_size=4)
    default = Pipeline(settings, model=model)
    separate = Pipeline(EnhanceSettings(device="cpu", detector="mtcnn", batch_size=4, detector_process=True),
                        model=model)
    config = SchedulerConfig(workers=2)
    try:
        # PNG outputs: a JPEG encoder turns a one-level difference into several, which would hide what is compared
        want = enhance(src, tmp_path / "thread", pipeline=default, config=config, ext="png").summary.results
        got = enhance(src, tmp_path / "process", pipeline=separate, config=config, ext="png").summary.results
        child = separate.detector("process")
        assert isinstance(child, ProcessDetector) and child.process.is_alive() and child.images == 4
    finally:
        default.close()
        separate.close()                 # closes the detector process too
    assert not child.process.is_alive()
    assert [r.status for r in got] == [r.status for r in want] == ["ok", "ok", "ok", "no_face", "error"]
    assert [len(r.faces) for r in got] == [len(r.faces) for r in want] == [1, 1, 4, 0, 0]
    for r_w, r_g in zip(want[:4], got[:4], strict=True):
        assert r_g.output.name == r_w.output.name
        for f_w, f_g in zip(r_w.faces, r_g.faces, strict=True):
            # the child runs its convolutions with its own torch thread count: float sums may round differently
            np.testing.assert_allclose(f_w.detection.landmarks, f_g.detection.landmarks, atol=1e-3)
        a, b = cv2.imread(str(r_w.output)).astype(int), cv2.imread(str(r_g.output)).astype(int)
        assert a.shape == b.shape and np.abs(a - b).max() <= TOLERANCE, r_w.output.name


# ---------------------------------------------------------------------------------------------------- shutdown


def test_child_exits_when_the_parent_dies(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(
        "import os, signal\n"
        "from gpen_tune.face.detect import DetectorSpec, ProcessDetector\n"
        "if __name__ == '__main__':\n"
        "    det = ProcessDetector(DetectorSpec('mtcnn', 'cpu', torch_threads=1))\n"
        "    print(det.process.pid, flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"     # no atexit, no close: only the pipe's EOF tells the child
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == -9, done.stderr[-2000:]
    pid = int(done.stdout.split()[0])
    deadline = time.monotonic() + 60
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(pid)


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's exit may be reaped late by whatever adopted it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def test_close_ends_the_child_and_frees_the_segment(proc, photos):
    proc.detect([photos[0]])
    segment = Path("/dev/shm") / proc._children[0].shm.name.lstrip("/")
    assert segment.exists()
    proc.close()
    assert not proc.process.is_alive() and proc.process.exitcode == 0     # it left on the close message
    assert not segment.exists()
    with pytest.raises(RuntimeError, match="closed"):
        proc.detect([photos[0]])
    proc.close()                                                         # twice is fine
