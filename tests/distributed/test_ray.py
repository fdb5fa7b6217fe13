"""`--ray` on a local Ray (2 CPUs, restore actors on the CPU): outputs equal the plain run's, a bad file fails
alone, a killed worker is replaced and the job completes with the same outputs, OUT as a filesystem URL."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest
from distributed_data import BROKEN, EXT, assert_same_outputs, mixed_folder, read_outputs, settings

from gpen_tune.pipeline.api import enhance
from gpen_tune.tune import TuneConfig

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")

from gpen_tune.distributed.ray_data import RayOptions, ray_enhance  # noqa: E402

pytestmark = pytest.mark.slow
CPU_ACTORS = RayOptions(num_gpus_per_actor=0, concurrency=1, cpu_concurrency=1, cpus_per_actor=0.5, batch_size=2)


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray], dict[str, str]]:
    tmp = tmp_path_factory.mktemp("plain")
    folder = mixed_folder(tmp / "in")
    result = enhance([folder], tmp / "out", settings(), TuneConfig(), ext=EXT)   # as the pools: all off
    return folder, read_outputs(tmp / "out"), {Path(j.source).name: j.status for j in result.jobs}


def statuses(result) -> dict[str, str]:
    return {Path(j.source).name: j.status for j in result.jobs}


def test_ray_equals_the_plain_run(local_ray, plain, tmp_path: Path) -> None:
    folder, outputs, status = plain
    seen = []
    result = ray_enhance([folder], tmp_path / "out", settings(), ext=EXT, options=CPU_ACTORS, on_result=seen.append)
    assert_same_outputs(read_outputs(tmp_path / "out"), outputs)
    assert statuses(result) == status and result.exit_code == 1
    broken = next(j for j in result.jobs if j.source.endswith(BROKEN))
    assert broken.error.startswith(str(folder / BROKEN)) and "\n" not in broken.error
    assert sorted(j.index for j in seen) == list(range(5))
    assert result.summary.faces == sum(len(j.faces) for j in result.jobs if j.status == "ok") > 0


def _map_workers() -> list[int]:
    """Pids of this Ray's actor processes that run dataset stages (their process title names the map worker)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if cmd.startswith("ray::") and "MapWorker" in cmd:
                pids.append(int(entry.name))
    return pids


def test_a_killed_worker_is_replaced_and_the_outputs_are_the_same(local_ray, plain, tmp_path: Path) -> None:
    folder, outputs, status = plain
    killed: list[int] = []

    def kill_one(job) -> None:
        if not killed:
            workers = _map_workers()                 # the restore actor first: later batches need it again
            assert workers, "no dataset worker process found"
            pid = max(workers, key=lambda p: "Restore" in Path(f"/proc/{p}/cmdline").read_bytes().decode())
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    result = ray_enhance([folder], tmp_path / "out", settings(), ext=EXT, options=CPU_ACTORS, on_result=kill_one)
    assert killed
    assert_same_outputs(read_outputs(tmp_path / "out"), outputs)
    assert statuses(result) == status


def test_output_through_a_filesystem_url(local_ray, plain, tmp_path: Path) -> None:
    folder, outputs, _ = plain
    photos = [folder / "astronaut.png", folder / "wall.png"]
    result = ray_enhance(photos, f"file://{tmp_path / 'out'}", settings(), ext=EXT, options=CPU_ACTORS)
    assert result.exit_code == 0
    assert_same_outputs(read_outputs(tmp_path / "out"), {k: v for k, v in outputs.items()
                                                          if k in ("astronaut.png", "wall.png")})
    again = ray_enhance(photos, f"file://{tmp_path / 'out'}", settings(), ext=EXT, options=CPU_ACTORS)
    assert again.exit_code == 1 and all("already exists" in j.error for j in again.refused)


def test_ray_pool_is_a_pipeline_for_enhance(local_ray, plain, tmp_path: Path) -> None:
    """A RayPool drives the steps in Ray's actors behind the Pipeline interface: `gpen_tune.enhance` runs a folder
    on it as on one pipeline, and refuses a video in one line (one tracker and one encoder per video)."""
    from gpen_tune.distributed.ray_data import RayPool

    folder, outputs, status = plain
    with RayPool(settings(), options=CPU_ACTORS) as pool:
        result = enhance([folder], tmp_path / "out", pipeline=pool, ext=EXT)
        assert_same_outputs(read_outputs(tmp_path / "out"), outputs)
        assert statuses(result) == status
        with pytest.raises(ValueError, match="videos run without --ray"):
            pool.run([], None, tracker=object())
