"""Internal patch `native-ops` (needed by compile and amp): pick the op path once, never in forward.

Upstream yangxy/GPEN 2c73670, face_model/op/fused_act.py and upfirdn2d.py: at import, on Linux with CUDA, they
JIT-build a CUDA extension; and `fused_leaky_relu` / `upfirdn2d` test `platform.system() == 'Linux' and
torch.cuda.is_available()` on every call. torch.compile fails on that call inside forward, and the compiled ops
raise under half precision (upstream, measured). Edits:
  * the module-level build runs only if `gpen_tune_runtime.use_cuda_ext()` also agrees (GPEN_TUNE_OPS=torch,
    or compile/amp on -> no build at all), and records `_GPEN_TUNE_CUDA_OPS = True` when it did build;
  * inside the functions the platform/CUDA terms are replaced by that import-time constant (the per-call
    `device != 'cpu'` term stays), so forward holds no `platform.system()` call.
  * face_model/gpen_model.py, ModulatedConv2d.forward starts with
    `if getattr(self, 'gpen_tune_fast', False): return gpen_tune_runtime.modulated_conv2d_fast(...)`:
    the batch-friendly formulation (scale activations, one shared conv, demodulation scale; no grouped conv,
    which is slow in half precision). FaceGAN sets the flag when compile/amp/GPEN_TUNE_FAST_MODCONV is on.
With every switch off: the extension is built exactly when upstream builds it and used exactly when upstream
uses it, and ModulatedConv2d runs upstream's code.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from gpen_tune.patcher.cst_tools import (
    RUNTIME,
    add_import,
    and_terms,
    calls,
    code,
    expected,
    method,
    param_names,
    prepend,
    replace_top,
    statements,
    top_level_class,
)
from gpen_tune.patcher.spec import EditContext, FileEdit, Patch

FLAG = "_GPEN_TUNE_CUDA_OPS"
_PLATFORM_TERMS = ("platform.system", "torch.cuda.is_available")


def _builds_extension(stmt: cst.BaseStatement) -> bool:
    return isinstance(stmt, cst.If) and bool(m.findall(stmt.body, m.Call(func=m.Name("load"))))


def _platform_if(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.If) and any(calls(node.test, t) for t in _PLATFORM_TERMS)


def edit_op_module(module: cst.Module, ctx: EditContext) -> cst.Module:
    module = add_import(module, ctx.path)
    body = list(module.body)
    hits = [i for i, s in enumerate(body) if _builds_extension(s)]
    if len(hits) != 1 or not _platform_if(body[hits[0]]):
        raise expected(ctx.path, "one top-level `if platform.system() == 'Linux' and torch.cuda.is_available():` "
                                 "block that calls `load(...)` to build the CUDA extension")
    block: cst.If = body[hits[0]]  # type: ignore[assignment]
    if block.orelse is not None:
        raise expected(ctx.path, "no `else:` on the extension-building `if`")
    test = cst.parse_expression(f"{RUNTIME}.use_cuda_ext() and ({code(block.test)})")
    inner = list(block.body.body) + statements(f"{FLAG} = True\n")
    block = block.with_changes(test=test, body=block.body.with_changes(body=inner))
    body[hits[0]: hits[0] + 1] = statements(f"{FLAG} = False  # gpen-tune: set once, at import\n") + [block]
    module = module.with_changes(body=body)

    class PerCall(cst.CSTTransformer):
        count = 0

        def leave_If(self, original, updated):
            if not _platform_if(original):
                return updated
            terms = and_terms(updated.test)
            kept = [t for t in terms if not any(calls(t, p) for p in _PLATFORM_TERMS)]
            if len(kept) == len(terms) or any(any(calls(t, p) for p in _PLATFORM_TERMS) for t in kept):
                raise expected(ctx.path, "the per-call op choice to be `platform... and torch.cuda... and ...`")
            PerCall.count += 1
            return updated.with_changes(test=cst.parse_expression(" and ".join([FLAG] + [code(t) for t in kept])))

    defs = [s for s in module.body if isinstance(s, cst.FunctionDef)]
    new_body = []
    for stmt in module.body:
        new_body.append(stmt.visit(PerCall()) if any(stmt is d for d in defs) else stmt)
    if PerCall.count == 0:
        raise expected(ctx.path, "a function that chooses the op path with `platform.system()` per call")
    return module.with_changes(body=new_body)


def edit_gpen_model(module: cst.Module, ctx: EditContext) -> cst.Module:
    module = add_import(module, ctx.path)
    cls = top_level_class(module, "ModulatedConv2d", ctx.path)
    fwd = method(cls, "forward", ctx.path)
    params = param_names(fwd)
    if len(params) != 3:
        raise expected(ctx.path, "`ModulatedConv2d.forward(self, input, style)`")
    init_attrs = code(method(cls, "__init__", ctx.path))
    for attr in ("weight", "scale", "modulation", "demodulate", "upsample", "downsample", "padding"):
        if f"self.{attr} =" not in init_attrs:
            raise expected(ctx.path, f"ModulatedConv2d.__init__ to set `self.{attr}`")
    hook = statements(f"if getattr(self, 'gpen_tune_fast', False):  # gpen-tune: batch-friendly formulation\n"
                      f"    return {RUNTIME}.modulated_conv2d_fast(self, {params[1]}, {params[2]})\n")
    new_cls = cls.with_changes(body=cls.body.with_changes(body=[
        prepend(s, hook) if s is fwd else s for s in cls.body.body]))
    return replace_top(module, cls, new_cls)


PATCH = Patch(
    name="native-ops",
    summary="op path chosen once at import (no platform.system() in forward); batch-friendly ModulatedConv2d",
    switches=("GPEN_TUNE_OPS", "GPEN_TUNE_FAST_MODCONV"),
    edits=(
        FileEdit("face_model/op/fused_act.py", edit_op_module, "CUDA build gated by GPEN_TUNE_OPS; no per-call "
                                                                "platform test"),
        FileEdit("face_model/op/upfirdn2d.py", edit_op_module, "CUDA build gated by GPEN_TUNE_OPS; no per-call "
                                                                "platform test"),
        FileEdit("face_model/gpen_model.py", edit_gpen_model, "ModulatedConv2d: optional batch-friendly forward"),
    ),
    requires=("runtime",),
    public=False,
)
