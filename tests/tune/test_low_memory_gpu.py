"""A 4 GiB GPU, emulated with `torch.cuda.set_per_process_memory_fraction` on any CUDA GPU: --preset low-memory
and `auto` as such a card chooses run the whole pipeline (detector, GPEN-BFR-512, paste) over a folder within
peak allocated <= 700 MiB and reserved <= 1.5 GiB, without an out-of-memory split or a failed image. The peak
counts what the pipeline allocates above what earlier tests of the process left allocated (a fresh process,
benchmarks/low_memory.py, measures it whole)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from gpen_tune.face import samples
from gpen_tune.pipeline import EnhanceSettings, Pipeline, enhance
from gpen_tune.tune.options import PRESETS, GiB, choose_preset

MiB = 1024**2
CAP = 4 * GiB

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
pytest.importorskip("facenet_pytorch", reason="the MTCNN detector (weights in its wheel) runs the pipeline offline")


@pytest.fixture
def four_gib_gpu():
    device = torch.device("cuda", torch.cuda.current_device())
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(min(1.0, CAP / total), device)
    yield device
    torch.cuda.set_per_process_memory_fraction(1.0, device)
    torch.cuda.empty_cache()


def photos(folder, n: int = 24):
    pictures = [samples.astronaut(), samples.grace_hopper(), samples.mosaic(6, seed=1)]
    for i in range(n):
        Image.fromarray(np.ascontiguousarray(pictures[i % 3])).save(folder / f"p{i:03d}.jpg", quality=90)


@pytest.mark.parametrize("preset", ["low-memory", "auto"])
def test_whole_pipeline_fits_a_4_gib_gpu(four_gib_gpu, tmp_path, preset):
    device = four_gib_gpu
    if preset == "auto":                  # what mem_get_info reports on a 4 GiB card
        name, tune, _ = choose_preset(min(torch.cuda.mem_get_info(device)[0], CAP), CAP)
        assert name == "low-memory"
    else:
        tune = PRESETS[preset]
    src = tmp_path / "in"
    src.mkdir()
    photos(src)
    settings = EnhanceSettings(model="GPEN-BFR-512", weights="synthetic", device="cuda", detector="mtcnn")
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)   # what earlier tests of this process left allocated
    reserved_before = torch.cuda.memory_reserved(device)
    with Pipeline(settings, tune) as pipe:
        result = enhance([str(src)], tmp_path / "out", pipeline=pipe)
        restorer = pipe.restorer
        assert result.summary.failed == 0 and result.summary.faces >= 24
        assert restorer.times.oom_splits == 0, restorer.fallbacks
    allocated = (torch.cuda.max_memory_allocated(device) - before) / MiB
    reserved = (torch.cuda.max_memory_reserved(device) - reserved_before) / MiB
    assert allocated <= 700, allocated
    assert reserved <= 1536, reserved
