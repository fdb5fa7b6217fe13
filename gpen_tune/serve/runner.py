"""Running the app under uvicorn with the service's rules: loopback unless a token (or an explicit no-auth)
guards it, and SIGTERM / Ctrl-C drain the requests in flight before the process exits (uvicorn's graceful
shutdown, then the app's: the job in progress completes, queued jobs stay in the spool for the next start)."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import Any

from gpen_tune.serve.limits import TOKEN_ENV, is_loopback

DRAIN_TIMEOUT_S = 300          # longest wait for requests in flight after SIGTERM


class UnsafeBind(ValueError):
    """Listening beyond this machine without auth."""


def check_bind(host: str, token: str | None, no_auth: bool) -> None:
    if token and no_auth:
        raise UnsafeBind("--token and --no-auth contradict each other: choose one")
    if not is_loopback(host) and not token and not no_auth:
        raise UnsafeBind(f"--host {host} listens beyond this machine: give a token (--token or {TOKEN_ENV}) that "
                         "clients send as 'Authorization: Bearer <token>', or pass --no-auth to allow anyone")


def run_server(app: Any, host: str, port: int, log_level: str = "info", access_log: bool = True) -> None:
    """Serve until SIGTERM / SIGINT; returns after the drain. `access_log`: a line per request (uvicorn's)."""
    import uvicorn  # optional: the serve extra

    class DrainingServer(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            """SIGTERM / SIGINT start the drain; a drained stop exits 0 (uvicorn's own handler raises the signal
            again after it, so that the process would end by the signal)."""
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=access_log,
                            timeout_graceful_shutdown=DRAIN_TIMEOUT_S)
    DrainingServer(config).run()
