"""Ray, the optional `[ray]` extra, imported in one place; and a cluster's address checked before Ray is asked to
join it (Ray's own connection attempts go on for minutes where nothing answers)."""

from __future__ import annotations

import socket
from typing import Any

from gpen_tune.extras import import_part


def import_ray() -> Any:
    """The `ray` module with `ray.data` loaded; MissingPart (one line naming the extra) without Ray."""
    import_part("ray.data", "--ray")
    return import_part("ray")


def check_address(address: str | None, timeout_s: float = 5.0) -> None:
    """ValueError (one line) unless something accepts a TCP connection at the host:port of `address` ("host:port"
    of a cluster's head or "ray://host:port" of Ray Client); None, "auto" and "local" are Ray's to resolve."""
    if address is None or address in ("auto", "local"):
        return
    host, sep, port = address.split("://", 1)[-1].rstrip("/").rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"--ray-address {address}: give host:port (e.g. 10.0.0.5:6379, ray://10.0.0.5:10001) "
                         "or auto")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as e:
        raise ValueError(f"--ray-address {address}: nothing answers at {host}:{port} ({e.strerror or e}); start "
                         "the cluster (ray start --head) or fix the address") from None
