"""`gpen-tune apply-patches`: the optimizations as structural source patches for an upstream GPEN checkout."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gpen_tune.cli import app
from gpen_tune.cli._console import err, fail, out
from gpen_tune.patcher.upstream import UPSTREAM_COMMIT, UPSTREAM_REPO

if TYPE_CHECKING:
    from gpen_tune.patcher import Plan

HELP = (
    f"Patch an upstream GPEN checkout ({UPSTREAM_REPO} {UPSTREAM_COMMIT}) in place with gpen-tune's optimizations.\n\n"
    "Each patch is a structural (libcst) edit; applying is all-or-nothing and idempotent, and keeps pristine copies "
    "in DIR/.gpen_tune/ for a byte-identical --revert.\n\n"
    "The patched checkout behaves as upstream until a switch is turned on at run time, with demo.py flags "
    "(--lazy_detector or --lazy_detector release, --compile MODE, --amp bf16|fp16, --ops torch, --checkpoint, "
    "--face_crop, --det_size N, --cuda_graph) or GPEN_TUNE_* environment variables (GPEN_TUNE_LAZY_DETECTOR, "
    "GPEN_TUNE_COMPILE, GPEN_TUNE_AMP, GPEN_TUNE_OPS, GPEN_TUNE_CHECKPOINT, GPEN_TUNE_FACE_CROP, GPEN_TUNE_DET_SIZE, "
    "GPEN_TUNE_CUDA_GRAPH)."
)


@app.command("apply-patches", help=HELP)
def apply_patches(
    directory: Annotated[Path, typer.Argument(metavar="DIR", help="the upstream GPEN checkout")] = Path("."),
    only: Annotated[str | None, typer.Option("--only", metavar="NAMES",
                                             help="comma-separated patch names (--status lists them)")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the unified diff, change nothing")] = False,
    revert: Annotated[bool, typer.Option("--revert", help="restore the original files (or drop --only NAMES)")] = False,
    show_status: Annotated[bool, typer.Option("--status", help="list the patches, marking those in DIR")] = False,
) -> None:
    if revert and show_status:
        raise fail("--revert and --status do not go together; run one, then the other")
    # The patch engine loads libcst (~0.5-0.9 s), so only this command imports it, not every CLI start.
    from gpen_tune.patcher import PatchError, locked_checkout, parse_only, plan_apply, plan_revert

    writes = not (dry_run or show_status)
    try:
        names = parse_only(only)
        with locked_checkout(directory, write=writes, notify=lambda msg: _say(msg, to_err=True)) as recovered:
            if recovered:
                _say(f"{directory}: rolled back an earlier apply-patches that was interrupted", to_err=True)
            if show_status:
                _print_status(directory)
                return
            plan = plan_revert(directory, names) if revert else plan_apply(directory, names)
            if plan.recognition is not None:
                _say(f"{directory}: {plan.recognition.describe()}", to_err=True)
            if not writes or plan.noop:
                _report_unchanged(directory, plan, revert, dry_run)
                return
            plan.commit()
    except PatchError as exc:
        raise fail(str(exc)) from None
    for rel in plan.shown:
        _say(f"  {'removed' if plan.writes[rel] is None else 'wrote'} {rel}")
    if revert:
        _say(f"{directory}: reverted; installed now: {', '.join(plan.after) or 'none (original files)'}")
    else:
        added = [n for n in plan.after if n not in plan.before]
        _say(f"{directory}: applied {', '.join(added)}; installed: {', '.join(plan.after)}. Switch them on at "
             f"run time (demo.py --help, GPEN_TUNE_*).")


def _report_unchanged(directory: Path, plan: Plan, revert: bool, dry_run: bool) -> None:
    """A no-op plan, or the diff of a dry run."""
    if plan.noop:
        if revert:
            _say(f"{directory}: nothing to revert (installed: {', '.join(plan.before) or 'none'})")
        else:
            _say(f"{directory}: already applied: {', '.join(plan.before)}; nothing to do")
        return
    if dry_run:
        typer.echo(plan.diff(), nl=False)
        _say(f"dry run: would {'revert to' if revert else 'apply'} "
             f"[{', '.join(plan.after) or 'upstream'}] ({len(plan.shown)} files); nothing changed")


def _say(msg: str, to_err: bool = False) -> None:
    (err if to_err else out).print(msg, markup=False, highlight=False, soft_wrap=True)


def _print_status(directory: Path) -> None:
    """What DIR is, and every patch (the names --only takes) with whether it is applied."""
    from gpen_tune.patcher import status
    from gpen_tune.patcher.patchset import load as load_patchset

    patchset = load_patchset()
    st = status(directory)
    _say(f"{directory}: {st.recognition.describe()}")
    if not st.installed:
        _say("no gpen-tune patches applied")
    for name in patchset.PUBLIC:
        mark = "applied" if name in st.installed else "-"
        _say(f"  {name:14s} {mark:8s} {patchset.BY_NAME[name].summary}")
    if st.installed:
        _say(f"files: {', '.join(st.files)} (all unmodified since patching)")
