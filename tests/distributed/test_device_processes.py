"""`DevicePool(mode="process")` on CPU stand-in devices: a worker process per device gives the files of one
pipeline; a device lost in a worker, or a worker process killed, hands its inputs to the other worker."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
from pathlib import Path

import numpy as np
import pytest
from distributed_data import EXT, LosingFactory, assert_same_outputs, mixed_folder, read_outputs, settings

from gpen_tune.distributed.devices import DevicePool
from gpen_tune.face import samples
from gpen_tune.pipeline.api import enhance
from gpen_tune.pipeline.sinks import MemorySink
from gpen_tune.pipeline.sources import ArraySource

pytestmark = pytest.mark.slow        # each run starts two worker processes (torch, the generator, the detector)


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray], dict[str, str]]:
    tmp = tmp_path_factory.mktemp("plain")
    folder = mixed_folder(tmp / "in")
    result = enhance([folder], tmp / "out", settings(), ext=EXT)
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


@pytest.mark.skip(reason="hangs at this commit: the parent does not notice a killed worker process (issue 19 note)")
def test_a_killed_worker_process_hands_its_inputs_on(plain, tmp_path: Path) -> None:
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
    assert statuses(result) == status
    lost = [lane for lane in lanes if lane["lost"]]
    assert len(lost) == 1 and "worker process ended" in lost[0]["lost"]


def test_arrays_take_thread_lanes_in_a_process_pool() -> None:
    tiles = [samples.mosaic(1, seed) for seed in range(2)]
    with DevicePool(settings(), devices=["cpu", "cpu"], mode="process") as pool:
        sink = MemorySink()
        summary = pool.run(ArraySource(tiles), sink)
    assert summary.failed == 0 and sorted(sink.results) == [0, 1]
