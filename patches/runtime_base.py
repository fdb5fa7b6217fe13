"""Internal patch `runtime` (installed with any other): our switch module plus demo.py's new flags.

Upstream yangxy/GPEN 2c73670. Adds `face_model/gpen_tune_runtime.py` (our own code; face_model/ is on sys.path
for every upstream module through __init_paths) with INSTALLED set to the patches being installed.
demo.py: right after `import __init_paths` it reads the GPEN_TUNE_* flags from argv (the CUDA extension is
built at import time, so the op-path switch must be known before `from face_enhancement import ...`); before
`args = parser.parse_args()` it adds the flags of the installed patches (so `--help` documents them) and after
it copies them into the GPEN_TUNE_* variables. Without any of the new flags demo.py behaves as upstream.
"""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import libcst.matchers as m

from gpen_tune.patcher.cst_tools import RUNTIME, code, expected, insert_around, replace_top, statements
from gpen_tune.patcher.recognise import parse
from gpen_tune.patcher.spec import AddedFile, EditContext, FileEdit, Patch

RUNTIME_SOURCE = Path(__file__).parent / "runtime" / "gpen_tune_runtime.py"
RUNTIME_PATH = f"face_model/{RUNTIME}.py"


def render_runtime(text: str, ctx: EditContext) -> str:
    """Set the INSTALLED tuple of the copied runtime module (a structural edit of our own file)."""
    module = parse(str(RUNTIME_SOURCE), text.encode())
    target = m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(target=m.Name("INSTALLED"))])])
    found = [s for s in module.body if m.matches(s, target)]
    if len(found) != 1:
        raise expected(str(RUNTIME_SOURCE), "exactly one top-level `INSTALLED = (...)`")
    value = cst.parse_expression("(" + "".join(f"{name!r}, " for name in ctx.installed).rstrip() + ")")
    assign = found[0].body[0]  # type: ignore[attr-defined]
    new = found[0].with_changes(body=[assign.with_changes(value=value)])  # type: ignore[attr-defined]
    return replace_top(module, found[0], new).code


def _is_import_init_paths(stmt: cst.BaseStatement) -> bool:
    return m.matches(stmt, m.SimpleStatementLine(body=[m.Import(names=[m.ImportAlias(name=m.Name("__init_paths"))])]))


def _parse_args_parser(stmt: cst.BaseStatement) -> str | None:
    """`args = <parser>.parse_args()` -> '<parser>'."""
    call = m.Call(func=m.Attribute(value=m.Name(), attr=m.Name("parse_args")))
    if m.matches(stmt, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(target=m.Name())], value=call)])):
        return stmt.body[0].value.func.value.value  # type: ignore[attr-defined]
    return None


def edit_demo(module: cst.Module, ctx: EditContext) -> cst.Module:
    module, n = insert_around(module, _is_import_init_paths, after=lambda s: statements(
        f"import {RUNTIME}\n"
        f"if __name__ == '__main__':\n"
        f"    {RUNTIME}.switches_from_argv()  # before the ops are imported: they may build a CUDA extension\n"))
    if n != 1:
        raise expected(ctx.path, "one top-level `import __init_paths`")

    def before(stmt):
        return statements(f"{RUNTIME}.add_arguments({_parse_args_parser(stmt)})\n")

    def after(stmt):
        target = code(stmt.body[0].targets[0].target)
        return statements(f"{RUNTIME}.apply_args({target})\n")

    module, n = insert_around(module, lambda s: _parse_args_parser(s) is not None, before, after)
    if n != 1:
        raise expected(ctx.path, "one `args = parser.parse_args()`")
    return module


PATCH = Patch(
    name="runtime",
    summary="gpen_tune_runtime module + demo.py flags for the installed switches",
    edits=(FileEdit("demo.py", edit_demo, "read GPEN_TUNE_* flags before imports; add them to --help"),),
    adds=(AddedFile(RUNTIME_PATH, RUNTIME_SOURCE, render_runtime),),
    public=False,
)
