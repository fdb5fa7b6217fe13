"""The `gpen-tune` command: a thin Typer layer over the library. Each command lives in its own module."""

from __future__ import annotations

import os
import signal
import sys


def _interrupted_at_start(signum, frame) -> None:
    """Ctrl-C while the command is still importing: exit 130 with one line, no traceback."""
    sys.stderr.write("\ninterrupted\n")
    os._exit(130)


def _started_as_the_command() -> bool:
    """The console script or `python -m gpen_tune`, not a library import (tests, notebooks keep Ctrl-C as is)."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return name in ("gpen-tune", "__main__.py") or sys.argv[0].endswith(os.path.join("gpen_tune", "__main__.py"))


if _started_as_the_command() and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, _interrupted_at_start)

import typer  # noqa: E402

app = typer.Typer(
    name="gpen-tune",
    help="GPEN blind face restoration, fast and with little GPU memory.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _register() -> None:
    # each command module adds its commands to `app` on import
    from gpen_tune.cli import bench, demo, doctor, enhance, export, patches, serve, weights  # noqa: F401


_register()


def main() -> None:
    """The console entry point: Ctrl-C before a command's own handling starts (imports, model loading) exits
    130 with one line instead of a traceback."""
    signal.signal(signal.SIGINT, signal.default_int_handler)   # from here on Ctrl-C is a KeyboardInterrupt
    try:
        app()
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        # The command is done: a Ctrl-C that lands while the interpreter shuts down (Python puts SIGINT back to
        # the default action there) would turn the exit status into a death by signal; ignored signals stay ignored.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
