"""One place for console output and for turning library exceptions into one-line messages.

Results go to stdout, notices and errors to stderr. `USER_ERRORS` is the one table of exceptions a command
reports as `error: <one line>` with exit 1 (anything else is a bug and keeps its traceback).
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console
from rich.markup import escape

out = Console()
err = Console(stderr=True)


def notice(msg: str) -> None:
    err.print(f"[bold yellow]notice:[/] {escape(msg)}", highlight=False, soft_wrap=True)


def fail(msg: str, code: int = 1) -> typer.Exit:
    """Print a one-line error and return the Exit to raise: `raise fail('...')`."""
    err.print(f"[bold red]error:[/] {escape(msg)}", highlight=False, soft_wrap=True)
    sys.stderr.flush()
    return typer.Exit(code)


def user_errors() -> tuple[type[BaseException], ...]:
    """The library's exceptions that mean "the input or a setting is wrong" (each says what and how to fix)."""
    from gpen_tune.extras import MissingPart
    from gpen_tune.face.detect import DetectorError  # heavy: torch (fast --help)
    from gpen_tune.imageio import ImageReadError  # heavy: torch (fast --help)
    from gpen_tune.pipeline.outputs import OutputError  # heavy: torch (fast --help)
    from gpen_tune.weights.cache import WeightsNotFoundError  # heavy: torch (fast --help)
    from gpen_tune.weights.checkpoint import CheckpointError  # heavy: torch (fast --help)

    return (OutputError, ImageReadError, DetectorError, CheckpointError, WeightsNotFoundError, MissingPart,
            ValueError, KeyError, OSError, RuntimeError)


def one_line(exc: BaseException) -> str:
    """The exception's message on one line (KeyError's quotes dropped), never cut."""
    text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)   # KeyError's repr quotes
    text = text.strip() or type(exc).__name__
    return " ".join(text.split())


def failure(exc: BaseException) -> typer.Exit:
    return fail(one_line(exc))
