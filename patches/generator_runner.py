"""Internal patch `generator-runner` (needed by compile, amp and cuda-graph): one hook in the FaceGAN wrapper.

Upstream yangxy/GPEN 2c73670, face_model/face_gan.py: `FaceGAN.load_model` ends with
`gpen_tune_runtime.prepare_facegan(self)`, which decides once per FaceGAN which runner to use (half cast with
fp32 islands, torch.compile, CUDA graph); `FaceGAN.process` calls `gpen_tune_runtime.run_generator(self, img_t)`
instead of `self.model(img_t)`. With no switch on the runner is None and `self.model(img_t)` runs as upstream.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from gpen_tune.patcher.cst_tools import (
    RUNTIME,
    add_import,
    append,
    expected,
    method,
    replace_top,
    statements,
    top_level_class,
)
from gpen_tune.patcher.spec import EditContext, FileEdit, Patch


def edit_face_gan(module: cst.Module, ctx: EditContext) -> cst.Module:
    module = add_import(module, ctx.path)
    cls = top_level_class(module, "FaceGAN", ctx.path)
    load = method(cls, "load_model", ctx.path)
    process = method(cls, "process", ctx.path)
    model_call = m.Call(func=m.Attribute(value=m.Name("self"), attr=m.Name("model")), args=[m.Arg(keyword=None)])
    found = m.findall(process, model_call)
    if len(found) != 1:
        raise expected(ctx.path, "exactly one `self.model(img_t)` call in FaceGAN.process")
    call: cst.Call = found[0]  # type: ignore[assignment]
    new_call = cst.parse_expression(f"{RUNTIME}.run_generator(self, x)").with_changes(
        args=[cst.Arg(cst.Name("self")), cst.Arg(call.args[0].value)])
    new_process = process.deep_replace(call, new_call)
    new_load = append(load, statements(f"{RUNTIME}.prepare_facegan(self)  # gpen-tune: amp/compile/cuda-graph\n"))
    mapping = {id(load): new_load, id(process): new_process}
    new_cls = cls.with_changes(body=cls.body.with_changes(body=[mapping.get(id(s), s) for s in cls.body.body]))
    return replace_top(module, cls, new_cls)


PATCH = Patch(
    name="generator-runner",
    summary="FaceGAN decides its generator runner once (load_model) and calls it in process",
    edits=(FileEdit("face_model/face_gan.py", edit_face_gan, "FaceGAN: prepare_facegan() + run_generator()"),),
    requires=("runtime",),
    public=False,
)
