"""`gpen-tune weights list | download NAME | verify PATH | path [NAME]`: thin layer over gpen_tune.weights.registry."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from gpen_tune.cli import app
from gpen_tune.cli._console import err, fail, notice, out
from gpen_tune.weights.download import DownloadError

weights_app = typer.Typer(
    name="weights",
    help="List, download, verify and locate the GPEN weights (one cache dir: $GPEN_TUNE_HOME).",
    no_args_is_help=True,
)

ModelArg = Annotated[str, typer.Argument(help="Registry name, e.g. GPEN-BFR-512 (see `gpen-tune weights list`).")]
Sha256Opt = Annotated[str | None, typer.Option("--sha256", help="Require and pin this sha256 (64 hex digits).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


@contextmanager
def _errors() -> Iterator[None]:
    """Known failures become one line on stderr and exit code 1."""
    from gpen_tune.weights.checkpoint import CheckpointError  # heavy: torch (fast --help)
    from gpen_tune.weights.registry import (  # heavy: torch (fast --help)
        WeightsDownloadError,
        WeightsMismatchError,
        WeightsNotFoundError,
    )

    try:
        yield
    except KeyError as e:  # unknown registry name: the message lists the known ones
        raise fail(str(e.args[0]) if e.args else str(e)) from None
    except (CheckpointError, DownloadError, WeightsDownloadError, WeightsMismatchError, WeightsNotFoundError,
            ValueError, OSError) as e:
        raise fail(str(e)) from None


def _mb(n: int | None) -> str:
    return "-" if n is None else f"{n / 1e6:.1f} MB"


@weights_app.command("list")
def list_cmd(as_json: JsonOpt = False) -> None:
    """Show every known model: file, config, task, source, licence, cached or not, pinned sha256."""
    from gpen_tune.weights.cache import cache_dir  # heavy: torch (fast --help)
    from gpen_tune.weights.registry import list_weights  # heavy: torch (fast --help)

    with _errors():
        rows = list_weights()
    if as_json:
        out.print_json(json.dumps({"cache_dir": str(cache_dir()), "models": [asdict(r) for r in rows]}))
        return
    table = Table(title="GPEN weights", title_justify="left")
    table.add_column("model", no_wrap=True)
    table.add_column("cached", no_wrap=True)
    table.add_column("size, cm, narrow", no_wrap=True)
    table.add_column("source", no_wrap=True)
    table.add_column("pinned sha256", no_wrap=True)
    for r in rows:
        modelscope = "modelscope" in r.source_note.lower()
        size, cm, narrow = (part.split()[-1] for part in r.config.split(", "))
        table.add_row(r.name, _mb(r.size) if r.cached else "[dim]no[/]", f"{size}, {cm}, {narrow}",
                      "ModelScope" if modelscope else "upstream link", (r.pinned_sha256 or "-")[:12])
    out.print(table)
    out.print(f"cache: {cache_dir()}  (set GPEN_TUNE_HOME to move it)", highlight=False, soft_wrap=True,
              markup=False)
    for r in rows:
        out.print(f"{r.name}: {r.url}", highlight=False, soft_wrap=True, markup=False)
    if rows:
        out.print(f"[dim]{rows[0].licence}[/]")
    out.print("[dim]GPEN-BFR-1024/2048 are distributed through ModelScope "
              "'damo/cv_gpen_image-portrait-enhancement-hires' (pytorch_model.pt / pytorch_model-2048.pt): download "
              "them there, then `gpen-tune weights download NAME --file PATH`.[/]")


@weights_app.command("download")
def download_cmd(
    name: ModelArg,
    sha256: Sha256Opt = None,
    url: Annotated[str | None, typer.Option("--url", help="Download from this URL (a mirror) instead.")] = None,
    file: Annotated[Path | None, typer.Option("--file", help="Use this local file (e.g. ModelScope's "
                                              "pytorch_model.pt) instead of downloading.")] = None,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Show a progress bar.")] = True,
    timeout: Annotated[float, typer.Option("--timeout", min=1, help="Seconds per connect/read; under 1 KiB in "
                                           "that time is a stall.")] = 30.0,
    retries: Annotated[int, typer.Option("--retries", min=0, help="Retries on transient errors.")] = 3,
) -> None:
    """Fetch NAME into the cache (verified: safe load, keys, shapes; sha256 pinned on first download)."""
    from gpen_tune.weights.registry import ensure_weights, import_weights  # heavy: torch (fast --help)

    if file is not None and url is not None:
        raise fail("--file and --url exclude each other: pass one source")
    with _errors():
        if file is not None:
            path = import_weights(name, file, sha256=sha256)
        else:
            path = ensure_weights(name, sha256=sha256, download=True, url=url, progress=progress, timeout=timeout,
                                  retries=retries)
    from gpen_tune.model.configs import model_info  # heavy: torch (fast --help)
    from gpen_tune.weights.pins import get_pin  # heavy: torch (fast --help)

    pin = get_pin(model_info(name).filename)
    out.print(str(path), highlight=False, soft_wrap=True, markup=False)
    if pin:
        err.print(f"sha256 {pin.sha256} (pinned {pin.pinned_at})", highlight=False)


@weights_app.command("verify")
def verify_cmd(
    path: Annotated[Path, typer.Argument(help="Checkpoint file to check.")],
    model: Annotated[str | None, typer.Option("--model", help="Expected registry model; default: infer it "
                                              "from the keys and shapes.")] = None,
    sha256: Sha256Opt = None,
    as_json: JsonOpt = False,
) -> None:
    """Check a weights file: loads with weights_only=True, every key and shape matches; print model, sha256, params."""
    from gpen_tune.weights.registry import verify_file  # heavy: torch (fast --help)

    with _errors():
        v = verify_file(path, model=model, sha256=sha256)
    if as_json:
        d = asdict(v)
        d["path"] = str(v.path)
        d["config"] = {"size": v.config.size, "channel_multiplier": v.config.channel_multiplier,
                       "narrow": v.config.narrow}
        out.print_json(json.dumps(d))
        return
    out.print(f"{v.path}: OK", highlight=False, soft_wrap=True, markup=False)
    out.print(f"model   {v.model}", highlight=False)
    out.print(f"sha256  {v.sha256}", highlight=False)
    out.print(f"params  {v.params:,} ({v.entries} state-dict entries)", highlight=False)
    if v.pin == "differs":
        notice(f"sha256 differs from the pinned {v.pinned_sha256} of {v.model} (not the cached file, so not refused)")
    elif v.pin == "matches":
        out.print("pin     matches the pinned sha256", highlight=False)


@weights_app.command("path")
def path_cmd(name: Annotated[str | None, typer.Argument(help="Registry name; omit for the cache dir.")] = None) -> None:
    """Print the cache dir, or where NAME's file is (or goes): handy as $(gpen-tune weights path GPEN-BFR-512)."""
    from gpen_tune.model.configs import model_info  # heavy: torch (fast --help)
    from gpen_tune.weights.cache import cache_dir, cached_file  # heavy: torch (fast --help)

    if name is None:
        out.print(str(cache_dir()), highlight=False, soft_wrap=True, markup=False)
        return
    with _errors():
        p = cached_file(model_info(name).filename)
    out.print(str(p), highlight=False, soft_wrap=True, markup=False)
    if not p.is_file():
        notice(f"{p.name} is not cached yet: `gpen-tune weights download {name}`")


app.add_typer(weights_app, name="weights")
