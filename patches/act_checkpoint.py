"""Patch `checkpoint` for upstream yangxy/GPEN 2c73670 (face_model/gpen_model.py): the inference-memory saver.

torch.utils.checkpoint does nothing at inference: under no_grad nothing is kept for backward. Upstream's
FullGenerator.forward keeps every encoder feature (the "noise" list, ~129 MB for GPEN-512 at batch 1) alive
until the whole decoder has finished. The same honest saver as gpen-tune's own runtime
(`FullGenerator(release_features=True)`): keep only the small encoder features, recompute the two largest from
the input when their decoder level comes, free each feature after its last use. Same output.
Edits: FullGenerator.__init__ ends with `self.gpen_tune_lowmem = gpen_tune_runtime.checkpoint_on()` (decided at
construction) and FullGenerator.forward starts with `if gpen_tune_runtime.lowmem_applies(self, ...): return
gpen_tune_runtime.full_generator_forward_lowmem(self, inputs)` (only for FaceGAN's call: default arguments).
Switch: GPEN_TUNE_CHECKPOINT=1 or demo.py --checkpoint (read when the FullGenerator is built). Off: upstream.
"""

from __future__ import annotations

import libcst as cst

from gpen_tune.patcher.cst_tools import (
    RUNTIME,
    add_import,
    append,
    assigned_self_attrs,
    expected,
    method,
    param_names,
    prepend,
    replace_top,
    statements,
    top_level_class,
)
from gpen_tune.patcher.spec import EditContext, FileEdit, Patch

FORWARD_KWARGS = ("return_latents", "inject_index", "truncation", "truncation_latent", "input_is_latent")
GENERATOR_ATTRS = ("style", "input", "conv1", "to_rgb1", "convs", "to_rgbs")


def edit_gpen_model(module: cst.Module, ctx: EditContext) -> cst.Module:
    module = add_import(module, ctx.path)
    gen = top_level_class(module, "Generator", ctx.path)
    have = assigned_self_attrs(method(gen, "__init__", ctx.path))
    missing = [a for a in GENERATOR_ATTRS if a not in have]
    if missing:
        raise expected(ctx.path, f"Generator.__init__ to set self.{', self.'.join(missing)}")
    cls = top_level_class(module, "FullGenerator", ctx.path)
    init, fwd = method(cls, "__init__", ctx.path), method(cls, "forward", ctx.path)
    have = assigned_self_attrs(init)
    missing = [a for a in ("generator", "names", "final_linear") if a not in have]
    if missing:
        raise expected(ctx.path, f"FullGenerator.__init__ to set self.{', self.'.join(missing)}")
    params = param_names(fwd)
    if len(params) < 2 or params[0] != "self" or not set(params[2:]) <= set(FORWARD_KWARGS):
        raise expected(ctx.path, "`FullGenerator.forward(self, inputs, return_latents=..., ...)`")
    kwargs = ", ".join(f"{p}={p}" for p in params[2:])
    hook = statements(
        f"if {RUNTIME}.lowmem_applies(self, {kwargs}):  # gpen-tune: GPEN_TUNE_CHECKPOINT\n"
        f"    return {RUNTIME}.full_generator_forward_lowmem(self, {params[1]})\n")
    new_init = append(init, statements(f"self.gpen_tune_lowmem = {RUNTIME}.checkpoint_on()  # gpen-tune\n"))
    mapping = {id(init): new_init, id(fwd): prepend(fwd, hook)}
    new_cls = cls.with_changes(body=cls.body.with_changes(body=[mapping.get(id(s), s) for s in cls.body.body]))
    return replace_top(module, cls, new_cls)


PATCH = Patch(
    name="checkpoint",
    summary="inference-memory saver in FullGenerator: free encoder features after last use, recompute the largest",
    switches=("GPEN_TUNE_CHECKPOINT",),
    edits=(FileEdit("face_model/gpen_model.py", edit_gpen_model, "FullGenerator: optional low-memory forward"),),
    requires=("runtime",),
)
