"""Small libcst helpers the patches share: find a class/def/statement or raise a PatchError naming the file."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import libcst as cst
import libcst.matchers as m

from gpen_tune.patcher.errors import PatchError

RUNTIME = "gpen_tune_runtime"


def expected(path: str, what: str) -> PatchError:
    return PatchError(f"{path}: expected {what}; this file does not look like upstream GPEN "
                      f"(yangxy/GPEN 2c73670), so it was not patched")


def code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


def statements(src: str) -> list[cst.BaseStatement]:
    return list(cst.parse_module(src).body)


def top_level_class(module: cst.Module, name: str, path: str) -> cst.ClassDef:
    for stmt in module.body:
        if isinstance(stmt, cst.ClassDef) and stmt.name.value == name:
            return stmt
    raise expected(path, f"a top-level class `{name}`")


def top_level_def(module: cst.Module, name: str, path: str) -> cst.FunctionDef:
    for stmt in module.body:
        if isinstance(stmt, cst.FunctionDef) and stmt.name.value == name:
            return stmt
    raise expected(path, f"a top-level function `{name}`")


def method(cls: cst.ClassDef, name: str, path: str) -> cst.FunctionDef:
    for stmt in cls.body.body:
        if isinstance(stmt, cst.FunctionDef) and stmt.name.value == name:
            return stmt
    raise expected(path, f"a method `{cls.name.value}.{name}`")


def param_names(fn: cst.FunctionDef) -> list[str]:
    return [p.name.value for p in fn.params.params]


def _is_docstring(stmt: cst.BaseStatement) -> bool:
    return (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr)
            and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString)))


def prepend(fn: cst.FunctionDef, new: Sequence[cst.BaseStatement]) -> cst.FunctionDef:
    """Insert statements at the start of a function body, after its docstring."""
    body = list(fn.body.body)
    at = 1 if body and _is_docstring(body[0]) else 0
    return fn.with_changes(body=fn.body.with_changes(body=body[:at] + list(new) + body[at:]))


def append(fn: cst.FunctionDef, new: Sequence[cst.BaseStatement]) -> cst.FunctionDef:
    return fn.with_changes(body=fn.body.with_changes(body=list(fn.body.body) + list(new)))


def add_to_class(cls: cst.ClassDef, new: Sequence[cst.BaseStatement]) -> cst.ClassDef:
    return cls.with_changes(body=cls.body.with_changes(body=list(cls.body.body) + list(new)))


def _is_import(stmt: cst.BaseStatement) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and all(
        isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body)


def imports(module: cst.Module, name: str) -> bool:
    """Is `import <name>` a top-level statement? (top level only: walking a whole module with libcst is slow)"""
    return any(_is_import(s) and any(isinstance(i, cst.Import) and any(code(a.name) == name for a in i.names)
                                     for i in s.body) for s in module.body)  # type: ignore[union-attr]


def top_level_imports(module: cst.Module) -> list[cst.Import | cst.ImportFrom]:
    return [i for s in module.body if _is_import(s) for i in s.body]  # type: ignore[union-attr,misc]


def add_import(module: cst.Module, path: str, name: str = RUNTIME) -> cst.Module:
    """`import <name>` after the last top-level import statement (once)."""
    if imports(module, name):
        return module
    body = list(module.body)
    last = max((i for i, s in enumerate(body) if _is_import(s)), default=None)
    if last is None:
        raise expected(path, "top-level import statements")
    return module.with_changes(body=body[: last + 1] + statements(f"import {name}\n") + body[last + 1:])


def replace_top(module: cst.Module, old: cst.BaseStatement, new: cst.BaseStatement) -> cst.Module:
    """Swap one top-level statement (cheaper than deep_replace, which walks the whole tree)."""
    body = [new if s is old else s for s in module.body]
    return module.with_changes(body=body)


def self_assignments(node: cst.CSTNode, attr: str) -> list[cst.Assign]:
    """Every `self.<attr> = ...` inside node."""
    target = m.AssignTarget(target=m.Attribute(value=m.Name("self"), attr=m.Name(attr)))
    return list(m.findall(node, m.Assign(targets=[target])))  # type: ignore[arg-type]


def assigned_self_attrs(node: cst.CSTNode) -> set[str]:
    found = m.findall(node, m.AssignTarget(target=m.Attribute(value=m.Name("self"))))
    return {t.target.attr.value for t in found}  # type: ignore[union-attr]


class _InsertAround(cst.CSTTransformer):
    def __init__(self, match: Callable[[cst.BaseStatement], bool], before, after) -> None:
        self.match, self.before, self.after, self.count = match, before, after, 0

    def _rewrite(self, body: Sequence[cst.BaseStatement]) -> list[cst.BaseStatement]:
        out: list[cst.BaseStatement] = []
        for stmt in body:
            if self.match(stmt):
                self.count += 1
                out += list(self.before(stmt)) + [stmt] + list(self.after(stmt))
            else:
                out.append(stmt)
        return out

    def leave_IndentedBlock(self, original, updated):
        return updated.with_changes(body=self._rewrite(updated.body))

    def leave_Module(self, original, updated):
        return updated.with_changes(body=self._rewrite(updated.body))


def insert_around(node, match, before=lambda s: [], after=lambda s: []):
    """Insert statements before/after every statement for which match(stmt) is true; returns (node, count)."""
    tool = _InsertAround(match, before, after)
    return node.visit(tool), tool.count


def and_terms(expr: cst.BaseExpression) -> list[cst.BaseExpression]:
    """Flatten `a and b and c` into its terms (any `or` stays inside one term)."""
    if isinstance(expr, cst.BooleanOperation) and isinstance(expr.operator, cst.And) and not expr.lpar:
        return and_terms(expr.left) + and_terms(expr.right)
    return [expr]


def calls(node: cst.CSTNode, dotted: str) -> bool:
    """Does node contain a call of `a.b.c(...)` spelled exactly like dotted?"""
    for call in m.findall(node, m.Call()):
        if code(call.func) == dotted:  # type: ignore[union-attr]
            return True
    return False
