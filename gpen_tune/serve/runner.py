"""Running the app under uvicorn with the service's rules: loopback unless a token (or an explicit no-auth)
guards it, and SIGTERM / Ctrl-C drain the requests in flight before the process exits (uvicorn's graceful
shutdown, then the app's: the job in progress completes, queued jobs stay in the spool for the next start)."""

from __future__ import annotations

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


def run_server(app: Any, host: str, port: int, log_level: str = "info") -> None:
    """Serve until SIGTERM / SIGINT; returns after the drain."""
    import uvicorn  # optional: the serve extra

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=DRAIN_TIMEOUT_S)
    uvicorn.Server(config).run()
