"""The parse mask runs on each generator batch (`Steps.restore`, called by every executor): on a folder holding a
two-face mosaic and a one-face photo, the serial and threaded outputs equal those of the per-image parse (the
image's faces parsed as one batch before the paste, as the pipeline once did), the parser
runs once per generator batch, and every image with faces records a parse time. On CUDA: the device paste reads the
batch's device masks, and starting a batch's masks makes no host sync.

Synthetic ParseNet weights (a seeded random network: the mask's pixels are arbitrary but deterministic), a tiny
synthetic GPEN (64 px), the offline MTCNN. Tolerances: the serial run restores the same batches as the reference,
so at most 1 grey level; threaded runs batch faces differently (float summation order), 2 as tests/pipeline/
test_threads.py."""

from __future__ import annotations

import threading
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from gpen_tune.face import samples
from gpen_tune.face.parse import SYNTHETIC, FaceParser, mask_area_iou
from gpen_tune.imageio import picture_from_array
from gpen_tune.load import load_model
from gpen_tune.model.configs import GPENConfig
from gpen_tune.pipeline import EnhanceSettings, FileSink, FileSource, OutputNaming, Pipeline, SchedulerConfig
from gpen_tune.pipeline.job import FaceCrop, ImageJob
from gpen_tune.pipeline.scheduler import run_serial
from gpen_tune.pipeline.steps import Steps
from gpen_tune.pipeline.threads import run_threaded

pytest.importorskip("facexlib")
pytestmark = pytest.mark.slow          # ParseNet at 512 px costs seconds per face on 2 CPU cores

THREADED_TOLERANCE = 2
FACES = [2, 1]                         # the folder's images, in order


class CountingParser(FaceParser):
    """The real parser, recording the batch size of every network call (thread-safe)."""

    def __init__(self, device: str = "cpu"):
        super().__init__(device, SYNTHETIC)
        self.calls: list[int] = []
        self._lock = threading.Lock()

    def masks_device(self, restored, inverses=None):
        with self._lock:
            self.calls.append(int(restored.shape[0]))
        return super().masks_device(restored, inverses)


def _write(path: Path, rgb: np.ndarray) -> Path:
    cv2.imwrite(str(path), np.ascontiguousarray(rgb[..., ::-1]))
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> list[Path]:
    d = tmp_path_factory.mktemp("parse_in")
    return [_write(d / "a_mosaic.png", samples.mosaic(2, 0)), _write(d / "b_astronaut.png", samples.astronaut())]


@pytest.fixture(scope="module")
def pipe():
    model = load_model("synthetic", model=GPENConfig(64, narrow=0.25))
    p = Pipeline(EnhanceSettings(device="cpu", detector="mtcnn", batch_size=4, parse_mask=False), model=model)
    yield p
    p.close()


def steps_with(pipe: Pipeline, parser: FaceParser | None, sink=None, service: str = "inline") -> Steps:
    return Steps(pipe.settings, pipe.restorer, sink, detector=pipe.detector(service), parser=parser)


def per_image_reference(pipe: Pipeline, paths: list[Path]) -> tuple[list[np.ndarray], list[int]]:
    """Every face restored in the serial run's batches, then each image parsed alone before its paste (its faces
    as one batch: the parse before it moved to the generator's batches). Returns (RGB outputs, parser calls)."""
    parser = CountingParser()
    steps = steps_with(pipe, None)
    jobs = steps.prepare([ImageJob(str(p), i, load=lambda p=p: str(p)) for i, p in enumerate(paths)])
    restored = list(pipe.restorer.restore_crops([f.crop for job in jobs for f in job.faces]))
    out = []
    for job in jobs:
        mine, restored = restored[:len(job.faces)], restored[len(job.faces):]
        masks = parser.masks(mine, [f.inverse for f in job.faces])
        for face, crop, mask in zip(job.faces, mine, masks, strict=True):
            face.restored, face.parse_mask = crop, mask
        out.append(steps.paste(job).rgb)
    return out, parser.calls


@pytest.fixture(scope="module")
def reference(pipe, folder):
    outputs, calls = per_image_reference(pipe, folder)
    assert calls == FACES                       # the per-image parse: one call per image
    return outputs


def _run(pipe: Pipeline, paths: list[Path], out: Path, serial: bool):
    parser = CountingParser()
    batches_before = pipe.restorer.times.batches
    sink = FileSink(OutputNaming(out, ext="png"))
    if serial:
        summary = run_serial(FileSource(paths), steps_with(pipe, parser, sink), batch_size=4)
    else:
        summary = run_threaded(FileSource(paths), steps_with(pipe, parser, sink, "thread"),
                               SchedulerConfig(workers=2, max_wait_ms=50.0))
    return summary, parser.calls, pipe.restorer.times.batches - batches_before


def _check(summary, reference, tolerance: int) -> None:
    assert [len(r.faces) for r in summary.results] == FACES
    for job, want in zip(summary.results, reference, strict=True):
        assert job.status == "ok", job.error
        got = cv2.imread(str(job.output))[..., ::-1].astype(int)
        assert np.abs(got - want.astype(int)).max() <= tolerance, job.source
        assert job.timings["parse"] > 0, job.source


def test_serial_parses_each_generator_batch_once_with_the_per_image_outputs(pipe, folder, reference, tmp_path):
    summary, calls, batches = _run(pipe, folder, tmp_path, serial=True)
    assert batches == 1 and calls == [3]        # the three faces of two images: one generator batch, one parse
    _check(summary, reference, 1)


def test_threaded_parses_each_generator_batch_once_with_the_per_image_outputs(pipe, folder, reference, tmp_path):
    summary, calls, batches = _run(pipe, folder, tmp_path, serial=False)
    assert len(calls) == batches and sum(calls) == sum(FACES)
    _check(summary, reference, THREADED_TOLERANCE)


def test_without_a_parser_nothing_is_parsed_and_no_parse_time(pipe, folder, tmp_path):
    steps = steps_with(pipe, None, FileSink(OutputNaming(tmp_path, ext="png")))
    summary = run_serial(FileSource(folder[1:2]), steps)
    assert summary.results[0].status == "ok" and "parse" not in summary.results[0].timings


# ---------------------------------------------------------------------------------------------------- CUDA


@pytest.mark.gpu
def test_cuda_batch_masks_start_without_host_sync_and_match_each_face_alone():
    """A restored batch on the device: its masks start with no host sync (an error in sync debug mode), a batch of
    device-pasted images keeps device masks, and each face's mask agrees with that face parsed alone (fp32
    parser)."""
    faces = torch.from_numpy(samples.aligned_face_crops(256, 2)).cuda()
    parser = FaceParser("cuda", SYNTHETIC, precision="fp32")
    settings = EnhanceSettings(device="cuda", paste="gpu")
    steps = Steps(settings, size=256, device=torch.device("cuda"), parser=parser, cut_on_device=False,
                  paste_impl="torch")
    job = ImageJob("two.png", picture=picture_from_array(np.zeros((2000, 1200, 3), np.uint8)), on_device=True)
    job.faces = [FaceCrop(None, np.eye(2, 3), np.eye(2, 3) * (1.0 + i), None) for i in range(2)]
    steps._start_masks([(job, 0), (job, 1)], faces).result()   # warm-up (cuDNN, pinned)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        pending = steps._start_masks([(job, 0), (job, 1)], faces)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    device, host, seconds = pending.result()
    assert seconds > 0 and host is None                        # device-pasted images: no host copy
    for k, face in enumerate(job.faces):
        alone = parser.masks_device(faces[k:k + 1], [face.inverse])[0]
        assert device[k].is_cuda
        assert mask_area_iou(alone, device[k]) >= 0.99
        assert (alone - device[k]).abs().mean().item() < 1e-3
