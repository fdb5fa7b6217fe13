"""`gpen-tune doctor`: versions, GPUs, compile support, optional parts and the weights cache, as a table or JSON."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from gpen_tune.cli import app
from gpen_tune.cli._console import err, out
from gpen_tune.doctor import diagnose


def _yes(v: object) -> str:
    if v is None:
        return "[dim]not checked (--imports)[/]"
    return "[green]yes[/]" if v else "[red]no[/]"


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.1f} GiB"


@app.command("doctor")
def doctor(
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON (keys: see gpen_tune.doctor).")]
    = False,
    imports: Annotated[bool, typer.Option("--imports", help="Also import facexlib / facenet_pytorch to prove they "
                                          "work (slower: they pull in torchvision).")] = False,
) -> None:
    """Check this machine: Python/torch/CUDA versions, GPUs and free memory, compile support, optional parts, cache."""
    r = diagnose(check_imports=imports)
    if as_json:
        out.print_json(json.dumps(r))
        return

    t = Table(title="gpen-tune doctor", show_header=False, title_justify="left")
    t.add_column("what", style="bold")
    t.add_column("value", overflow="fold")
    tv = r["torch"]
    t.add_row("python", f"{r['python']['version']} ({r['python']['executable']})")
    t.add_row("gpen-tune", r["gpen_tune"]["version"])
    t.add_row("torch", f"{tv.get('version')}  torchvision {tv.get('torchvision')}")
    t.add_row("CUDA / cuDNN (build)", f"{tv.get('cuda')} / {tv.get('cudnn')}")
    if r["gpus"]:
        for g in r["gpus"]:
            t.add_row(f"GPU {g['index']}", f"{g['name']} (sm {g['capability']}): {_gib(g['free_bytes'])} free of "
                      f"{_gib(g['total_bytes'])}")
        t.add_row("bf16", _yes(r["cuda"]["bf16"]))
    else:
        t.add_row("GPU", "[bold red]none[/]" + (f" ({r['cuda']['error']})" if r["cuda"]["error"] else ""))
    t.add_row("MPS", _yes(r["mps"]["available"]))
    c = r["compile"]
    t.add_row("torch.compile", f"{c['note']} (inductor {_yes(c['inductor'])}, C++ {c['cxx'] or '[red]none[/]'}, "
              f"triton {c['triton'] or '[red]none[/]'})")
    for name, p in r["optional"].items():
        if not p["installed"]:
            state = "[yellow]not installed[/]"
        elif p["importable"] is False:
            state = f"[red]installed, import fails[/]: {p['error']}"
        else:
            state = f"{p['version']}  import {_yes(p['importable'])}"
        t.add_row(name, f"{state}  [dim]{p['purpose']}[/]")
    for name, p in r["not_used"].items():
        t.add_row(name, f"[dim]{p['reason']}[/]")
    cache = r["cache"]
    t.add_row("cache dir", f"{cache['dir']}" + (" [dim](from GPEN_TUNE_HOME)[/]" if cache["env"] else "")
              + ("" if cache["exists"] else " [dim](not created yet)[/]"))
    for f in cache["files"]:
        pin = f"sha256 {f['pinned_sha256'][:16]}…" if f["pinned_sha256"] else "not pinned"
        t.add_row("", f"{f['name']}  {f['bytes'] / 1e6:.1f} MB  {pin}")
    for f in cache["partial"]:
        t.add_row("", f"{f['name']}  {f['bytes'] / 1e6:.1f} MB  [yellow]partial download (resumes)[/]")
    shm = r["shared_memory"]
    t.add_row("shared memory", "[dim]none[/]" if shm["free_bytes"] is None else
              f"{shm['dir']}: {_gib(shm['free_bytes'])} free ({_gib(shm['serve_needs_bytes'])} for serve's request "
              f"processes: {_yes(shm['enough_for_serve'])})")
    out.print(t)
    for w in r["warnings"]:
        err.print(f"[bold red]WARNING:[/] {w}", highlight=False)
