"""`DevicePool(mode="process")` on CPU stand-in devices: a worker process per device gives the files of one
pipeline; a device lost in a worker, or a worker process killed, hands its inputs to the other worker; with every
worker killed each input left fails in one line; no temp file of a killed encode stays.

No test here can hang: the parent waits on each worker's pipe and process with a timeout (`workers.py`)."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from distributed_data import (
    BROKEN,
    EXT,
    KillingFactory,
    LosingFactory,
    assert_same_outputs,
    mixed_folder,
    read_outputs,
    settings,
)

from gpen_tune.distributed.devices import DevicePool
from gpen_tune.distributed.workers import remove_partial_writes
from gpen_tune.face import samples
from gpen_tune.pipeline.api import enhance
from gpen_tune.pipeline.outputs import OutputNaming
from gpen_tune.pipeline.sinks import MemorySink
from gpen_tune.pipeline.sources import ArraySource
from gpen_tune.tune import TuneConfig

pytestmark = pytest.mark.slow        # each run starts two worker processes (torch, the generator, the detector)
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray], dict[str, str]]:
    tmp = tmp_path_factory.mktemp("plain")
    folder = mixed_folder(tmp / "in")
    result = enhance([folder], tmp / "out", settings(), TuneConfig(), ext=EXT)   # as the pools: all off
    return folder, read_outputs(tmp / "out"), {Path(j.source).name: j.status for j in result.jobs}


def statuses(result) -> dict[str, str]:
    return {Path(j.source).name: j.status for j in result.jobs}


def test_worker_processes_equal_one_pipeline_and_survive_a_lost_device(plain, tmp_path: Path) -> None:
    folder, outputs, status = plain
    with DevicePool(settings(), devices=["cpu", "cpu"], mode="process",
                    restorer_factories=[LosingFactory(after=0), None]) as pool:
        result = enhance([folder], tmp_path / "out", ext=EXT, pipeline=pool)
        first, second = pool.device_summary()
    assert_same_outputs(read_outputs(tmp_path / "out"), outputs)
    assert statuses(result) == status and result.exit_code == 1
    assert "device lost" in first["lost"] and first["retried_elsewhere"] >= 1 and first["faces"] == 0
    assert second["lost"] is None and second["faces"] == result.summary.faces > 0



def test_a_killed_worker_process_hands_its_inputs_on(plain, tmp_path: Path) -> None:
    """A worker killed from outside mid-run (SIGKILL, as the OOM killer): the run still ends, with the same files
    (no temp file left) and statuses, and the summary names the lost worker and its signal."""
    folder, outputs, status = plain
    killed: list[int] = []

    def kill_first_worker(job) -> None:
        if not killed:
            worker = next(p for p in mp.active_children() if p.name == "gpen-cpu")
            os.kill(worker.pid, signal.SIGKILL)
            killed.append(worker.pid)

    with DevicePool(settings(), devices=["cpu", "cpu"], mode="process") as pool:
        result = enhance([folder], tmp_path / "out", ext=EXT, pipeline=pool, on_result=kill_first_worker)
        lanes = pool.device_summary()
    assert killed
    assert_same_outputs(read_outputs(tmp_path / "out"), outputs)
    assert statuses(result) == status and result.exit_code == 1          # the broken file, as in the plain run
    lost = [lane for lane in lanes if lane["lost"]]
    assert len(lost) == 1 and lost[0]["lost"] == "worker process ended (exit code -9, SIGKILL)"
    assert sum(lane["images"] for lane in lanes) == 5


def test_a_worker_killed_at_its_first_batch_hands_its_inputs_on(plain, tmp_path: Path) -> None:
    """The first worker holds the astronaut (dealt first) and dies at its first batch: the other does its work."""
    folder, outputs, status = plain
    with DevicePool(settings(), devices=["cpu", "cpu"], mode="process",
                    restorer_factories=[KillingFactory(), None]) as pool:
        result = enhance([folder], tmp_path / "out", ext=EXT, pipeline=pool)
        first, second = pool.device_summary()
    assert_same_outputs(read_outputs(tmp_path / "out"), outputs)
    assert statuses(result) == status and result.exit_code == 1
    assert first["lost"] == "worker process ended (exit code -9, SIGKILL)" and first["retried_elsewhere"] >= 1
    assert first["faces"] == 0 and second["lost"] is None and second["faces"] == result.summary.faces > 0


def test_every_worker_killed_fails_each_input_in_one_line(plain, tmp_path: Path) -> None:
    folder, outputs, status = plain
    with DevicePool(settings(), devices=["cpu", "cpu"], mode="process",
                    restorer_factories=[KillingFactory(), KillingFactory()]) as pool:
        result = enhance([folder], tmp_path / "out", ext=EXT, pipeline=pool)
        lanes = pool.device_summary()
    assert result.exit_code == 1
    assert all(lane["lost"] == "worker process ended (exit code -9, SIGKILL)" for lane in lanes)
    for job in result.jobs:
        name = Path(job.source).name
        if name in ("astronaut.png", "hopper.jpg", "mosaic.png"):          # faces: a batch, so a kill
            assert job.status == "error"
        if job.status == "error" and name != BROKEN:
            assert job.error.startswith(str(folder / name)) and "\n" not in job.error
            assert "every device was lost" in job.error and "SIGKILL" in job.error
        else:                                                              # done before both were killed
            assert job.status == status[name]
    written = read_outputs(tmp_path / "out")                                # no temp file, nothing half written
    assert set(written) <= {"wall.png"}
    assert_same_outputs(written, {k: v for k, v in outputs.items() if k in written})


WRITE_BIG = """
import sys
import numpy as np
from gpen_tune.imageio import Picture, write_image
noise = np.random.default_rng(0).integers(0, 256, (4000, 4000, 3), dtype=np.uint8)
write_image(Picture(noise), sys.argv[1], "PNG")
"""


def test_the_temp_file_of_an_encode_killed_mid_write_is_removed(tmp_path: Path) -> None:
    """A process killed while it encodes leaves the encoder's temp file; `remove_partial_writes` removes it (and
    only the temp files of that input)."""
    out = tmp_path / "out"
    (out / "faces").mkdir(parents=True)
    finished = {out / "big.png": b"done", out / ".bigger.png.abcd1234.part": b"another input's",
                out / "faces" / "big_face00.png": b"done"}
    for path, data in finished.items():
        path.write_bytes(data)
    side = out / "faces" / ".big_face00.png.abcd1234.part"
    side.write_bytes(b"half")
    proc = subprocess.Popen([sys.executable, "-c", WRITE_BIG, str(out / "big.png")], cwd=REPO)
    try:
        deadline = time.monotonic() + 120
        while not (partial := sorted(out.glob(".big.png.*.part"))) and time.monotonic() < deadline:
            assert proc.poll() is None, "the encode ended before it could be killed"
            time.sleep(0.005)
    finally:
        proc.kill()
        proc.wait()
    assert partial and all(p.exists() for p in partial)
    removed = remove_partial_writes(OutputNaming(out, ext="png"), "big")
    assert sorted(removed) == sorted([*partial, side])
    assert sorted(p for p in out.rglob("*") if p.is_file()) == sorted(finished)
    assert all(path.read_bytes() == data for path, data in finished.items())


def test_arrays_take_thread_lanes_in_a_process_pool() -> None:
    tiles = [samples.mosaic(1, seed) for seed in range(2)]
    with DevicePool(settings(), devices=["cpu", "cpu"], mode="process") as pool:
        sink = MemorySink()
        summary = pool.run(ArraySource(tiles), sink)
    assert summary.failed == 0 and sorted(sink.results) == [0, 1]
