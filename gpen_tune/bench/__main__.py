"""`python -m gpen_tune.bench ...`: the bench command on its own (same options as `gpen-tune bench`)."""

import typer

from gpen_tune.cli.bench import bench

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
app.command()(bench)

if __name__ == "__main__":
    app(prog_name="gpen-tune bench")
