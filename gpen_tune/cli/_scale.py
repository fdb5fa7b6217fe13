"""Scale-out for `gpen-tune enhance`: `--devices` (a `DevicePool` in place of the `Pipeline`) and `--ray` (a `RayPool`,
run through `gpen_tune.distributed.ray_data.ray_enhance` so that OUT may be a URL), both fitted into
`run_command`'s build/run slots so the progress, summary and report stay the plain run's."""

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


def ray_builder(address: str | None, gpus_per_actor: float) -> Callable[..., Any]:
    """`build(settings, tune, notify=...)` for run_command: Ray Data driving the pipeline's steps in its actors."""
    from gpen_tune.distributed.ray_data import RayOptions, RayPool  # optional: ray (the [ray] extra)

    def build(settings: Any, tune: Any, notify: Callable[[str], None]) -> RayPool:
        return RayPool(settings, tune, options=RayOptions(address=address, num_gpus_per_actor=gpus_per_actor),
                       notify=notify)

    return build


def ray_runner(output: str) -> Callable[..., Any]:
    """`run(...)` for run_command: `ray_enhance` on the built pool (`output` as typed: a URL stays one)."""
    from gpen_tune.distributed.ray_data import ray_enhance  # optional: ray (the [ray] extra)

    def run(names, _output, settings, tune, *, pipeline, recursive, ext, suffix, name_pattern, existing,
            save_faces, save_comparison, serial, config, on_result, on_faces, on_start, video, notify,
            save_mask=False, report=None) -> Any:
        return ray_enhance(names, output, pool=pipeline, recursive=recursive, ext=ext, suffix=suffix,
                           name_pattern=name_pattern, existing=existing, save_faces=save_faces,
                           save_comparison=save_comparison, on_result=on_result, on_faces=on_faces,
                           on_start=on_start, notify=notify)

    return run
