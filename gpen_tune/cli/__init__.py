"""The `gpen-tune` command: a thin Typer layer over the library. Each command lives in its own module."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="gpen-tune",
    help="GPEN blind face restoration, fast and with little GPU memory.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _register() -> None:
    # each command module adds its commands to `app` on import
    from gpen_tune.cli import bench, demo, doctor, enhance, weights  # noqa: F401


_register()


def main() -> None:
    app()
