"""Scale-out for `gpen-tune enhance`: `--devices` (a `DevicePool` in place of the `Pipeline`) and `--ray` (the
run through `gpen_tune.distributed.ray_data.ray_enhance`), both fitted into `run_command`'s build/run slots so the
progress, summary and report stay the plain run's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def device_pool_builder(spec: str) -> Callable[..., Any]:
    """`build(settings, tune, notify=...)` for run_command: one pipeline per device of `spec` ("all", "0,1,3")."""
    from gpen_tune.distributed.devices import DevicePool, parse_devices  # heavy: torch (fast --help)

    devices = parse_devices(spec)

    def build(settings: Any, tune: Any, notify: Callable[[str], None]) -> DevicePool:
        return DevicePool(settings, tune, devices=devices, notify=notify)

    return build


class RayRun:
    """What run_command reads of a pipeline, for a run whose pipelines live in Ray actors."""

    def __init__(self, settings: Any, tune: Any, notify: Callable[[str], None]):
        self.settings = settings
        self.restorer = None
        self.device = "ray"
        self.weights_source = settings.weights

    def prepare(self) -> str | None:
        return None if self.settings.aligned else self.settings.detector

    def close(self) -> None:
        return None


def ray_runner(output: str, address: str | None, gpus_per_actor: float) -> Callable[..., Any]:
    """`run(...)` for run_command: `ray_enhance` with the command's choices (`output` as typed: a URL stays one)."""
    from gpen_tune.distributed.ray_data import RayOptions, ray_enhance  # optional: ray (the [ray] extra)

    def run(names, _output, settings, tune, *, pipeline, recursive, ext, suffix, name_pattern, existing,
            save_faces, save_comparison, serial, config, on_result, on_faces, on_start, video, notify,
            save_mask=False, report=None) -> Any:
        def done(job: Any) -> None:                  # faces are known per image once it is written
            if job.status == "ok":
                on_faces(job.face_count)
            on_result(job)

        return ray_enhance(names, output, settings, tune, options=RayOptions(address=address,
                           num_gpus_per_actor=gpus_per_actor), recursive=recursive, ext=ext, suffix=suffix,
                           name_pattern=name_pattern, existing=existing, save_faces=save_faces,
                           save_comparison=save_comparison, on_result=done, on_start=on_start, notify=notify)

    return run
