"""Beyond one GPU: every GPU of one host (`devices.DevicePool`, `enhance --devices`) and clusters through Ray Data
(`ray_data.ray_enhance`, `enhance --ray`). Ray is an optional extra (`pip install 'gpen-tune[ray]'`)."""

from __future__ import annotations

import importlib

_LAZY = {
    "DevicePool": "devices", "parse_devices": "devices", "is_device_failure": "devices",
    "ray_enhance": "ray_data", "RayOptions": "ray_data", "RayPool": "ray_data",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f"gpen_tune.distributed.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'gpen_tune.distributed' has no attribute {name!r}")
