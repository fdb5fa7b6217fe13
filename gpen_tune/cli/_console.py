"""One place for console output: results to stdout, notices and errors to stderr."""

from __future__ import annotations

import sys

import typer
from rich.console import Console

out = Console()
err = Console(stderr=True)


def notice(msg: str) -> None:
    err.print(f"[bold yellow]notice:[/] {msg}")


def fail(msg: str, code: int = 1) -> typer.Exit:
    """Print a one-line error and return the Exit to raise: `raise fail('...')`."""
    err.print(f"[bold red]error:[/] {msg}", highlight=False, soft_wrap=True)
    sys.stderr.flush()
    return typer.Exit(code)
